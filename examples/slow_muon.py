"""A slow but correct sharded Muon: ``--impl examples.slow_muon:slow_muon`` must pass every gate.

It is ``distributed_impl.ShardedMuon`` whose rank 1 spends ``MUONGATE_SLOW_S`` seconds
(default 2.5) before its first step in each process, as a cold ``torch.compile`` under load
does, while rank 0 already waits in the step's first collective. A rank that is slow is not
a hang: the harness must wait for it (``tests/test_crashing_candidates.py``).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist

from distributed_impl import ShardedMuon

_COMPILED = False


class SlowMuon(ShardedMuon):
    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        global _COMPILED
        if not _COMPILED and dist.get_rank() == 1:
            time.sleep(float(os.environ.get("MUONGATE_SLOW_S", "2.5")))
        _COMPILED = True
        return super().step(closure)


def slow_muon(param_groups: list[dict[str, Any]], **settings: Any) -> SlowMuon:
    return SlowMuon(param_groups, **settings)
