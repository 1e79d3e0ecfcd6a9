"""A sharded Muon that deadlocks on some cases: ``--impl examples.deadlock_muon:deadlock_muon``.

It is ``distributed_impl.ShardedMuon`` that first all-reduces the squared norm of each
matrix's gradient (to clip by the global norm), but skips the all-reduce for a matrix whose
local shard is empty, as one might to save a collective that "has nothing to add". Ranks
then disagree about how many collectives there are: with a 1-row matrix on two ranks, one
rank finishes the step while its peer waits in an all-reduce that nobody will join.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from distributed_impl import ShardedMuon


class DeadlockMuon(ShardedMuon):
    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                local = p.grad.to_local() if p.grad is not None else None
                if local is not None and local.numel():
                    squares = local.float().pow(2).sum().reshape(1)
                    dist.all_reduce(squares, group=p.device_mesh.get_group(p.device_mesh.ndim - 1))
        return super().step(closure)


def deadlock_muon(param_groups: list[dict[str, Any]], **settings: Any) -> DeadlockMuon:
    return DeadlockMuon(param_groups, **settings)
