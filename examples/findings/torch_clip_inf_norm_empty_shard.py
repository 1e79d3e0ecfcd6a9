"""``torch.nn.utils.clip_grad_norm_`` with the infinity norm fails under FSDP2 where a rank's
piece of a gradient is empty (torch 2.13 and 2.11, gloo).

Run: ``torchrun --standalone --nproc-per-node 2 examples/findings/torch_clip_inf_norm_empty_shard.py``
(only torch; exits 1 while the finding holds, 0 once it is gone).

An ``nn.Linear(7, 1)`` (its weight is one row) under ``fully_shard`` on two ranks: rank 1 holds
a ``[0, 7]`` piece. ``clip_grad_norm_(model.parameters(), 1.0, norm_type=inf)`` runs
``_foreach_norm`` on each rank's local piece, and on the empty one it raises "_foreach_norm
cannot compute the infinity norm on an empty tensor", where on one device the same model clips
without error (checked first, below). The 2-norm is not affected: an empty piece's sum is 0.
Any FSDP2 model with a parameter of fewer rows than ranks (a one-row projection, a bias under
more ranks than its length) meets it. muongate's clipping gate judges torch's clip with the
2-norm where a case has an empty piece (``gates/test_clip_gates.py``), and
``tests/test_found_beyond_muon.py`` runs this file, so that the day torch fixes it shows.
"""

import math
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    one = nn.Linear(7, 1, bias=False)
    one.weight.grad = torch.randn(1, 7)
    expected = one.weight.grad.abs().max().item()
    on_one_device = torch.nn.utils.clip_grad_norm_(one.parameters(), 1.0, norm_type=math.inf).item()
    model = nn.Linear(7, 1, bias=False)
    fully_shard(model, mesh=init_device_mesh("cpu", (2,)))
    model.weight.grad = torch.distributed.tensor.distribute_tensor(
        torch.randn(1, 7), model.weight.device_mesh, model.weight.placements
    )
    local = list(model.weight.grad.to_local().shape)
    print(
        f"rank {rank}: one device: inf-norm {on_one_device:.6f} (max |g| {expected:.6f}); FSDP2 piece {local}",
        flush=True,
    )
    try:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, norm_type=math.inf)
    except RuntimeError as e:
        print(f"rank {rank}: clip_grad_norm_(inf) under FSDP2 fails: {str(e).splitlines()[0][:110]}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    # A rank that failed may leave its peer inside a collective: no teardown.
    sys.stdout.flush()
    os._exit(main())
