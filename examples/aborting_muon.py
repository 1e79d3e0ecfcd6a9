"""A sharded Muon that aborts on some cases: ``--impl examples.aborting_muon:aborting_muon``.

It is ``distributed_impl.ShardedMuon`` that first all-reduces a copy of each matrix's local
gradient rows (to check them for NaNs across ranks, say), as if every rank held the same
rows: a data-parallel habit carried over to FSDP. Where the rows divide evenly it computes
what ``ShardedMuon`` computes.
Where the rows do not divide evenly over the ranks (7 rows on two ranks: 4 and 3), the
ranks pass all-reduces of different sizes, and gloo aborts the process (SIGABRT,
"Received data size doesn't match").
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from distributed_impl import ShardedMuon


class AbortingMuon(ShardedMuon):
    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    rows = p.grad.to_local().flatten().clone()
                    dist.all_reduce(rows, group=p.device_mesh.get_group(p.device_mesh.ndim - 1))
        return super().step(closure)


def aborting_muon(param_groups: list[dict[str, Any]], **settings: Any) -> AbortingMuon:
    return AbortingMuon(param_groups, **settings)
