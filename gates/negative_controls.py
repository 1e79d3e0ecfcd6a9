"""Known-wrong sharded Muons. Each plants one bug that real implementations have shipped;
the gates must catch every one (``test_negative_controls.py``), or they prove nothing.

Each class overrides exactly one hook of ``ShardedMuon`` and always runs in
``all_ranks`` mode, so the bug is the only difference from the real implementation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor

from distributed_impl import ShardedMuon, placement
from reference import apply_update, lr_scale


class _AllRanks(ShardedMuon):
    def __init__(self, params: Any, **kwargs: Any) -> None:
        kwargs["mode"] = "all_ranks"
        super().__init__(params, **kwargs)


class PartialNormMuon(_AllRanks):
    """Normalizes each shard by a Frobenius norm all-reduced from per-shard partial sums
    before gathering, instead of taking the norm of the gathered matrix."""

    def _gathered_ns(self, update: Tensor, p: DTensor, ns: Callable[[Tensor], Tensor]) -> Tensor:
        sq = update.float().pow(2).sum().reshape(1)
        dist.all_reduce(sq, group=placement.shard_group(p))
        normalized = (update.float() / (sq.sqrt() + 1e-7)).to(update.dtype)
        return placement.local_rows(ns(placement.gather_full(normalized, p)), p)


class LocalRowsMuon(_AllRanks):
    """Orthogonalizes only this rank's rows: block-wise, not the full matrix."""

    def _gathered_ns(self, update: Tensor, p: DTensor, ns: Callable[[Tensor], Tensor]) -> Tensor:
        return ns(update) if update.shape[0] else update


class PaddedGatherMuon(_AllRanks):
    """Gathers equal-sized padded shards and leaves the zero padding rows in the matrix."""

    def _gathered_ns(self, update: Tensor, p: DTensor, ns: Callable[[Tensor], Tensor]) -> Tensor:
        group = placement.shard_group(p)
        shards = dist.get_world_size(group)
        per = math.ceil(p.shape[0] / shards)
        padded = torch.zeros((per, *update.shape[1:]), dtype=update.dtype, device=update.device)
        padded[: update.shape[0]] = update
        parts = [torch.empty_like(padded) for _ in range(shards)]
        dist.all_gather(parts, padded, group=group)
        full = ns(torch.cat(parts))
        me = dist.get_rank(group)
        return full[me * per : me * per + update.shape[0]]


class OffByOneRowsMuon(_AllRanks):
    """Takes this rank's rows of the orthogonalized matrix one row late: an off-by-one
    shard boundary (rows ``start + 1 .. end + 1``, wrapping round at the end)."""

    def _gathered_ns(self, update: Tensor, p: DTensor, ns: Callable[[Tensor], Tensor]) -> Tensor:
        full = ns(placement.gather_full(update, p))
        return placement.local_rows(torch.roll(full, -1, dims=0), p)


class LocalShapeLrMuon(_AllRanks):
    """Computes the lr scale from the local shard's shape instead of the matrix's."""

    def _lr_scale(self, p: DTensor, group: dict[str, Any]) -> float:
        shape = p.to_local().shape
        if shape[-2] == 0:
            return 1.0
        return lr_scale(shape, group["adjust_lr_fn"])


class WrongNesterovMuon(_AllRanks):
    """Mixes Nesterov with the buffer from *before* this step's gradient was added."""

    def _momentum(self, buf: Tensor, grad: Tensor, group: dict[str, Any], out: Tensor) -> None:
        g = grad.float()
        old = buf.clone()
        mu = group["momentum"]
        if group["momentum_form"] == "ema":
            buf.lerp_(g, 1 - mu)
            out.copy_(g.lerp(old, mu) if group["nesterov"] else buf)
        else:
            buf.mul_(mu).add_(g)
            out.copy_(g.add(old, alpha=mu) if group["nesterov"] else buf)


class DecayAfterUpdateMuon(_AllRanks):
    """Applies weight decay after the orthogonalized update instead of before it."""

    def _apply(self, local: Tensor, ortho: Tensor, group: dict[str, Any], scaled_lr: float) -> None:
        apply_update(local, ortho, group["lr"], 0.0, scaled_lr)
        if group["weight_decay"]:
            p = local.float()
            p.mul_(1 - group["lr"] * group["weight_decay"])
            local.copy_(p)


NEGATIVE_CONTROLS = {
    cls.__name__: f"{__name__}:{cls.__name__}"
    for cls in (
        PartialNormMuon,
        LocalRowsMuon,
        PaddedGatherMuon,
        OffByOneRowsMuon,
        LocalShapeLrMuon,
        WrongNesterovMuon,
        DecayAfterUpdateMuon,
    )
}
