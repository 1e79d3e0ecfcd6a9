"""``pytorch-optimizer`` 4.1.0's ``Muon`` on FSDP2 parameters hangs when a matrix has a gradient
on some ranks only (torch 2.13, gloo).

Run: ``torchrun --standalone --nproc-per-node 2 examples/findings/pytorch_optimizer_gradient_on_one_rank.py``
(only torch and ``pytorch-optimizer==4.1.0``; exits 1 while the finding holds, 0 once it is gone).

Its Newton–Schulz gathers each DTensor update whole (``full_tensor``), a collective; a rank
without the gradient skips the parameter, so the others wait in the gather. Here: an
``nn.Linear(4, 4)`` weight under ``fully_shard`` on 2 ranks, with a gradient on rank 0
only. Seen: rank 1 prints "step completed" and exits; rank 0 waits in the gather until
rank 1's exit closes the connection ("Connection closed by peer"); in a loop that goes on,
it would wait for the process group's timeout (10 s here). FSDP2's own
backward gives every rank a gradient or none, so this takes a gradient set by hand (a
rank-local loss term, a frozen shard); muongate's own ``ShardedMuon`` refuses it by name.
A limit of the package, not shown to hurt a plain FSDP2 loop.
"""

import datetime
import sys

import torch
import torch.distributed as dist
from pytorch_optimizer import Muon
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import distribute_tensor


def main() -> int:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(4, 4, bias=False)
    mesh = init_device_mesh("cpu", (2,))
    fully_shard(model, mesh=mesh)
    if rank == 0:
        model.weight.grad = distribute_tensor(torch.randn(4, 4), mesh, model.weight.placements, src_data_rank=None)
    opt = Muon([{"params": [model.weight], "use_muon": True}], foreach=False)
    try:
        opt.step()
    except Exception as e:  # the finding is the timed-out gather
        print(f"rank {rank}: step failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
        return 1
    print(f"rank {rank}: step completed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
