"""Imported once by the CPU pool's forkserver where the gate session preloads it
(``harness.runner.RANK_PRELOAD``): warms what every rank's first case would otherwise pay for,
so that every rank forked from the server starts warm. A task's room, not the pool's: it
steps a candidate (``ShardedMuon``).

One FSDP2 forward and ``ShardedMuon`` step, on a one-rank process group of torch's ``fake``
backend (its collectives do nothing), destroyed before any rank is forked: the rank inherits
torch's lazily built dispatch, DTensor and FSDP2 caches (about 1.5 s of a fresh rank's
first case on the 2-core machine), not a process group.

A server that forks must hold no thread but the interpreter's: a forked child inherits
every thread's locks and state, but not the threads. gloo's backend starts three threads
(``gloo_tcp_loop``, two ``pt_gloo_runloop``) that outlived ``destroy_process_group`` here,
and ranks forked beside them died of SIGSEGV now and then; the ``fake`` backend starts none.
One thread for torch, so that no OpenMP pool is made either. No backward: it would start
autograd's device threads.

Everything here is pinned to the CPU: a mesh left to its default picks the accelerator, and
a server that has initialized CUDA cannot fork a rank that uses it ("Cannot re-initialize
CUDA in forked subprocess").
"""

from __future__ import annotations

from typing import cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from distributed_impl import ShardedMuon


def warm() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
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
