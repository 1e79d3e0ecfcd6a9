"""FSDP2 over tensor parallelism loses the shape of an empty TP piece (torch 2.13, gloo).

Run: ``torchrun --standalone --nproc-per-node 4 examples/findings/fsdp2_over_tp_empty_piece.py``
(only torch; exits 1 while the finding holds, 0 once it is gone).

A ``[2, 1]`` weight, ``RowwiseParallel`` on a ``tp`` dim of 2 (tp rank 1 holds a ``[2, 0]``
piece), then ``fully_shard`` on a ``dp`` dim of 2: the parameter's placements are
``(Shard(0), Shard(1))``, so the ranks of tp rank 1 should hold ``[1, 0]``; they hold
``[0, 0]``, and the parameter's own ``full_tensor()`` fails there with "Expected cond to
be True" (its peers then lose them, and torchrun ends the job). ``ColwiseParallel`` with
fewer rows than TP ranks (a ``[0, cols]`` piece) is not affected: checked the same way.
muongate's layout cases avoid the shape (``harness.cases.strategies.layout_cases``) and
``tests/test_layouts.py`` runs this file, so that the day torch fixes it shows.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = nn.Module()
    model.w = nn.Linear(1, 2, bias=False)
    parallelize_module(model, mesh["tp"], {"w": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    p = model.w.weight
    shape, expected = list(p.to_local().shape), [1, 1] if rank % 2 == 0 else [1, 0]
    # Printed before any rank can fail: torchrun ends every rank when the first one exits.
    print(f"rank {rank}: rowwise [2, 1] under FSDP2 {p.placements}: local {shape} (expected {expected})", flush=True)
    try:
        p.full_tensor()
    except RuntimeError as e:
        print(f"rank {rank}: full_tensor() fails: {str(e).splitlines()[0][:100]}", flush=True)
        return 1
    return 1 if shape != expected else 0


if __name__ == "__main__":
    # The ranks that failed left their peers inside a collective: no teardown.
    sys.stdout.flush()
    os._exit(main())
