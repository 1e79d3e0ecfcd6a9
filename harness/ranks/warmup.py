"""Imported once by the CPU pool's forkserver (``harness.ranks.pool``): warms what every rank's
first case would otherwise pay for, so that every rank forked from the server starts warm.

One FSDP2 forward and ``ShardedMuon`` step on a one-rank gloo group held in memory,
destroyed before any rank is forked: the rank inherits torch's lazily built dispatch, DTensor
and FSDP2 caches, not a process group. Everything here is pinned to the CPU: a mesh left to
its default picks the accelerator, and a server that has initialized CUDA cannot fork a
rank that uses it ("Cannot re-initialize CUDA in forked subprocess").

No backward: on torch 2.11 built with CUDA (the H200 machine) an FSDP2 backward here starts
autograd's device threads, even with ``CUDA_VISIBLE_DEVICES`` empty, and no rank forked from
the server can then run a backward ("Unable to handle autograd's threading in combination
with fork-based multiprocessing"): measured there, each of forward only, and a plain
backward with the GPUs hidden, forks fine. The step's gradients are set by hand.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from distributed_impl import ShardedMuon


def warm() -> None:
    # One thread: an OpenMP thread pool made here would be inherited, half dead, by every
    # forked rank, whose first parallel region then never returns.
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
        world = cast(dist.ProcessGroup, dist.group.WORLD)
        fully_shard(model, mesh=DeviceMesh.from_group(world, "cpu"))
        opt = ShardedMuon([{"params": list(model.parameters()), "use_muon": True}])
        model(torch.ones(2, 4))
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
    finally:
        dist.destroy_process_group()


if dist.is_available() and not dist.is_initialized():
    warm()
