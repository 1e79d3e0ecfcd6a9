"""A training job of a user's kind that captures its own layout (``harness.capture``).

A two-layer MLP whose second matrix has 3 rows, so that its shards are uneven, laid out with FSDP2 (``fully_shard``) at 2 ranks and with tensor parallelism
(``parallelize_module``) under FSDP2 on a ``(dp, tp)`` mesh at 4; muongate's ``ShardedMuon`` for
the matrices and its AdamW groups for the biases; one step, then the capture::

    torchrun --standalone --nproc-per-node 2 examples/capture_job.py layout.json
    python -m harness.capture layout.json
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from distributed_impl import ShardedMuon
from harness.capture import capture


def main(path: str) -> None:
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 8), nn.ReLU(), nn.Linear(8, 3))
    if world >= 4 and world % 2 == 0:
        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(model, mesh=mesh["dp"])
    else:
        fully_shard(model, mesh=init_device_mesh("cpu", (world,), mesh_dim_names=("dp",)))
    named = list(model.named_parameters())
    matrices = [(n, p) for n, p in named if p.ndim == 2]
    vectors = [(n, p) for n, p in named if p.ndim != 2]
    optimizer = ShardedMuon(
        [
            {"params": [p for _, p in matrices], "param_names": [n for n, _ in matrices], "use_muon": True},
            {"params": [p for _, p in vectors], "param_names": [n for n, _ in vectors], "use_muon": False},
        ],
        lr=0.02,
    )
    model(torch.randn(4, 10)).sum().backward()
    optimizer.step()
    capture(model, optimizer, path)
    dist.barrier()  # every rank out of its last collective before any tears gloo down
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    # Leave without the interpreter's teardown: gloo's threads outlive destroy_process_group after
    # DTensor and can abort the job there (findings/torch_gloo_threads_outlive_destroy.py).
    sys.stdout.flush()
    os._exit(0)
