"""``torch.optim.Adafactor`` cannot step FSDP2's DTensor parameters (torch 2.13, gloo, CPU).

Run: ``torchrun --standalone --nproc-per-node 2 examples/findings/torch_adafactor_dtensor.py``
(torch only; exits 1 while the finding holds, 0 once it is gone).

Its factored second moment takes a column mean as ``torch.norm(grad, dim=-2,
keepdim=True).square_()``. On a row-sharded DTensor the norm over rows is a ``_NormPartial``
(each rank holds a partial norm), and an in-place ``square_`` of it is refused: ``RuntimeError:
aten.pow_.Scalar: in-place operations that require placement changes are not supported``. The
gates found it as an error on the first case of every gate under ``--impl
gates.examples.torch_adafactor:adafactor_for_loop``, on a one-rank FSDP2 mesh already
(``w0[4, 4] · world 1 · 1 step``). A bug in torch: its optimizer uses an in-place op that
DTensor does not support on the placement its own reduction returns.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def main() -> int:
    dist.init_process_group("gloo")
    model = torch.nn.Linear(4, 4, bias=False)
    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    opt = torch.optim.Adafactor(model.parameters(), foreach=False)
    model(torch.randn(2, 4)).sum().backward()
    failed = 0
    try:
        opt.step()
        print(f"rank {dist.get_rank()}: stepped", flush=True)
    except RuntimeError as e:
        print(f"rank {dist.get_rank()}: RuntimeError: {str(e).splitlines()[0][:140]}", flush=True)
        failed = 1
    dist.barrier()  # every rank has printed before any leaves: torchrun stops the rest once one exits non-zero
    dist.destroy_process_group()
    return failed


if __name__ == "__main__":
    # Leave without the interpreter's teardown: gloo's threads outlive destroy_process_group after
    # DTensor and can abort the job there (findings/torch_gloo_threads_outlive_destroy.py).
    code = main()
    sys.stdout.flush()
    os._exit(code)
