"""Imported once by the pool's forkserver (``harness.ranks.pool``): warms what every rank's
first case would otherwise pay for, so that every rank forked from the server starts warm.

One FSDP2 forward, backward and ``ShardedMuon`` step on a one-rank gloo group held in memory,
destroyed before any rank is forked: the rank inherits torch's lazily built dispatch, DTensor
and FSDP2 caches, not a process group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from distributed_impl import ShardedMuon


def warm() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
        fully_shard(model)
        opt = ShardedMuon([{"params": list(model.parameters()), "use_muon": True}])
        model(torch.ones(2, 4)).square().sum().backward()
        opt.step()
    finally:
        dist.destroy_process_group()


if dist.is_available() and not dist.is_initialized():
    warm()
