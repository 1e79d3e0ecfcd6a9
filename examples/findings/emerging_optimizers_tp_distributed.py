"""``emerging-optimizers`` 0.3.0's ``newton_schulz_tp``: its ``distributed`` mode is not its
``duplicated`` mode's arithmetic, even on one rank (Python 3.12; CPU, gloo).

Run: ``torchrun --nproc-per-node 1 examples/findings/emerging_optimizers_tp_distributed.py``, and
again with ``--nproc-per-node 2`` (only torch, ``emerging-optimizers==0.3.0`` and ``absl-py``;
prints what it measures, exits 0).

Each rank holds its even block of a float32 matrix along ``partition_dim``, as Megatron lays a
weight out, and both modes run five iterations of Keller Jordan's quintic under
``fp32_matmul_precision("medium")`` (bf16 Newton–Schulz, the package's default):

* ``duplicated`` gathers the blocks and runs ``newton_schulz`` on the whole matrix: each rank's
  block of the result is bitwise that of ``newton_schulz`` on one device;
* ``distributed`` keeps the blocks: the norm from an all-reduced sum of squares (not
  ``F.normalize``), each Gram matrix from all-reduced bf16 partial products, and the matrix
  oriented by ``partition_dim`` (rows split: transposed), not by its shape, so a wide matrix
  split by rows is orthogonalized from its long side, as its docstring warns.

Seen: ``duplicated`` is bitwise one device everywhere. On one rank, ``distributed`` is
bitwise ``duplicated`` where the split agrees with the shape's own orientation (a wide matrix
split by columns, a tall one by rows) and differs where it does not (a square matrix split by
rows, 0.027; a wide one by rows, 0.016): the orientation alone. On two ranks it differs on
every shape (0.008 to 0.039), the partial sums added. By design (the same mathematics in
another order), so a gate comparing it bit for bit with single-device Muon, or with its own
single-device self, fails; it stays within the cause tier of the adapter's declared
differences.
"""

import os
import sys

import torch
import torch.distributed as dist
from emerging_optimizers.orthogonalized_optimizers.muon_utils import newton_schulz, newton_schulz_tp


def main() -> None:
    dist.init_process_group("gloo")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    torch.set_float32_matmul_precision("medium")
    for shape, dim in (((8, 8), 0), ((8, 16), 0), ((8, 16), 1), ((16, 8), 0)):
        full = torch.randn(shape, generator=torch.Generator().manual_seed(0))
        block = full.chunk(ranks, dim)[rank].contiguous()
        one_device = newton_schulz(full, 5, "simple").chunk(ranks, dim)[rank]
        modes = {m: newton_schulz_tp(block, 5, "simple", group, dim, m) for m in ("duplicated", "distributed")}
        print(
            f"rank {rank} of {ranks}: {list(shape)} split on dim {dim}: duplicated vs one device max|diff| "
            f"{(modes['duplicated'] - one_device).abs().max().item():.3g}, distributed vs duplicated "
            f"{(modes['distributed'] - modes['duplicated']).abs().max().item():.3g}",
            flush=True,
        )
    dist.barrier()  # every rank has printed before any leaves: torchrun stops the rest once one exits non-zero
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Leave without the interpreter's teardown: gloo's threads outlive destroy_process_group after
    # DTensor and can abort the job there (findings/torch_gloo_threads_outlive_destroy.py).
    sys.stdout.flush()
    os._exit(0)
