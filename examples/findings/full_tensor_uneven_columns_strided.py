"""A limit of muongate's full-copies bridge, from two facts of torch (CPU, gloo).

Run: ``torchrun --nproc-per-node 2 examples/findings/full_tensor_uneven_columns_strided.py``
(torch only; prints what it sees, exits 0).

1. On torch 2.11, ``full_tensor()`` of a matrix split unevenly by columns (``Shard(1)``, a
   ``[21, 17]`` bf16 matrix over 2 ranks: 9 and 8 columns) returns the right values as a view
   of the padded gather: strides ``(18, 1)``, not contiguous. torch 2.13 returns it contiguous.
2. On the CPU, a bf16 ``add_(other, alpha=…)`` rounds otherwise when ``other`` is strided than
   when it is contiguous, with the same values (both torch versions; it is the known
   length-dependent bf16 ``add(alpha)`` of the vectorized loop against the scalar one).

So an optimizer written for whole tensors, handed such a gradient by the bridge
(``examples/full_copies.py``), rounded its bf16 momentum (``m·β + (1 − β)·g``) otherwise from
the second step: optimuon against itself differed by 1 to 3 bf16 ULP on rowwise TP matrices,
on torch 2.11 only. DDP never hands a package a strided gradient, so the bridge now hands the
whole tensors contiguous, and the difference is gone (4 seeds of 4, torch 2.11). Not a
finding about optimuon.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor


def main() -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    g = torch.randn(21, 17).bfloat16()
    whole = distribute_tensor(g, mesh, [Shard(1)]).full_tensor()
    if dist.get_rank() == 0:
        print(f"1. torch {torch.__version__}: full_tensor of [21, 17] Shard(1): equal {torch.equal(whole, g)}, "
              f"contiguous {whole.is_contiguous()}, strides {whole.stride()}")  # fmt: skip
        strided = torch.empty(21, 18, dtype=torch.bfloat16)[:, :17].copy_(g)
        buf = torch.randn(21, 17).bfloat16()
        a, b = buf.clone().mul_(0.95).add_(g, alpha=0.05), buf.clone().mul_(0.95).add_(strided, alpha=0.05)
        print(f"2. bf16 mul_(0.95).add_(g, alpha=0.05), g contiguous against strided: bitwise {torch.equal(a, b)}, "
              f"max|diff| {(a.float() - b.float()).abs().max().item():.3g}")  # fmt: skip
    dist.barrier()  # rank 1 tearing its group down while rank 0 still computes aborted rank 0 now and then
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Leave without the interpreter's teardown: gloo's threads outlive destroy_process_group after
    # DTensor and can abort the job there (findings/torch_gloo_threads_outlive_destroy.py).
    sys.stdout.flush()
    os._exit(0)
