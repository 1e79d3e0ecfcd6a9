"""muon-fsdp2 0.3.0 orthogonalizes the wrong matrix when a parameter is split by columns (torch 2.13, gloo).

Run: ``torchrun --standalone --nproc-per-node 2 examples/findings/muon_fsdp2_column_shards.py``
(only torch and ``muon-fsdp2==0.3.0``; exits 1 while the behaviour holds, 0 once it is gone).

``Fsdp1dWork`` takes any DTensor on a 1-D mesh as FSDP2 lays it out, split by rows
(``Shard(0)``): the owner concatenates the gathered local pieces along dim 0 and splits the
result the same way. It never reads the placement. A ``Shard(1)`` parameter on a 1-D mesh, as
``RowwiseParallel`` leaves a weight, is then stacked from column blocks into a ``[2m, n/2]``
matrix that is not the weight, and the step is silently another one. Here: one ``[4, 4]``
weight, one step, split by columns against the same weight split by rows (which FSDP2 does
and the package handles). The package says it handles FSDP2's 1-D mesh; it neither refuses
nor handles other placements: a limit of the package that gives a wrong result without an error.
"""

import os
import sys

import torch
import torch.distributed as dist
from muon_fsdp2 import Muon
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor


def step(placement: Shard, weight: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    p = torch.nn.Parameter(distribute_tensor(weight, mesh, [placement]))
    p.grad = distribute_tensor(grad, mesh, [placement])
    Muon([{"params": [p], "use_muon": True, "lr": 0.02}]).step()
    return p.detach().full_tensor()


def main() -> int:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    weight, grad = torch.randn(4, 4), torch.randn(4, 4)
    by_rows, by_columns = step(Shard(0), weight, grad), step(Shard(1), weight, grad)
    off = (by_rows - by_columns).abs().max().item()
    moved = (by_rows - weight).abs().max().item()
    print(
        f"rank {dist.get_rank()}: one step split by columns against split by rows: max|diff| {off:.3g} "
        f"(the step moved the weight by up to {moved:.3g})",
        flush=True,
    )
    dist.barrier()  # every rank has printed before any leaves: torchrun stops the rest once one exits non-zero
    dist.destroy_process_group()
    return 1 if off else 0


if __name__ == "__main__":
    # Leave without the interpreter's teardown: gloo's threads outlive destroy_process_group after
    # DTensor and can abort the job there (findings/torch_gloo_threads_outlive_destroy.py).
    code = main()
    sys.stdout.flush()
    os._exit(code)
