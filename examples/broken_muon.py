"""A deliberately broken sharded Muon: ``--impl examples.broken_muon:broken_muon`` must fail.

It is ``distributed_impl.ShardedMuon`` with weight decay computed from the *scaled* lr
(lr · √max(1, rows/cols)) instead of the plain lr: a one-line slip that only shows on
tall matrices with weight decay, which is what the gates must find and shrink to.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from distributed_impl import ShardedMuon
from reference import apply_update


class BrokenMuon(ShardedMuon):
    def _apply(self, local: Tensor, ortho: Tensor, group: dict[str, Any], scaled_lr: float) -> None:
        decay_with_scaled_lr = group["weight_decay"] * scaled_lr / group["lr"] if group["lr"] else 0.0
        apply_update(local, ortho, group["lr"], decay_with_scaled_lr, scaled_lr)


def broken_muon(param_groups: list[dict[str, Any]], **settings: Any) -> BrokenMuon:
    return BrokenMuon(param_groups, **settings)
