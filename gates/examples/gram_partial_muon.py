"""A tensor-parallel Muon that never gathers a row-wise weight: ``--impl
gates.examples.gram_partial_muon:gram_partial_muon`` (layout ``tp``).

For a ``Shard(1)`` weight (its columns split over the ranks, as ``RowwiseParallel`` leaves
it) that is not tall, Newton–Schulz runs on the local columns: the squared norm and the Gram
matrix ``X Xᵀ`` are sums over the column blocks, so each rank computes its partial product
and they are all-reduced (in float32), as NVIDIA Emerging-Optimizers' distributed mode
does; ``(b·A + c·A²) X`` then needs only the local columns. Everything else is gathered.

Correct, and not bitwise: the all-reduce sums in another order than one matrix product.
``gates/test_layout_gates.py`` holds its update to the calibrated tier
``harness.verdicts.compare.GRAM_PARTIAL``; ``gram_partial_local_gram_muon`` (the Gram left local, no
all-reduce) is the variant that tier must reject.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from gates.examples.gathered_muon import GatheredMuon
from harness.candidates import Candidate
from reference import coefficient_schedule, orthogonalize


def _sum(t: Tensor, p: DTensor, reduce: bool) -> Tensor:
    out = t.float()
    if reduce:
        dist.all_reduce(out, group=p.device_mesh.get_group(0))
    return out


def partial_gram_ns(X_local: Tensor, p: DTensor, group: dict[str, Any], reduce: bool = True) -> Tensor:
    """Newton–Schulz of a column-sharded, not tall matrix on its local columns."""
    schedule, safety = coefficient_schedule(group["ns_coefficients"])
    X = X_local.to(group["ns_dtype"])
    norm = _sum(X.float().pow(2).sum(), p, reduce).sqrt().to(X.dtype)
    X = X / (norm * safety + group["eps"])
    for i in range(group["ns_steps"]):
        a, b, c = schedule[min(i, len(schedule) - 1)]
        A = _sum(X @ X.mT, p, reduce).to(X.dtype)
        X = torch.addmm(X, torch.addmm(A, A, A, beta=b, alpha=c), X, beta=a)
    return X


class GramPartialMuon(GatheredMuon):
    """``GatheredMuon``'s momentum (sum form, Nesterov) with the reference's Newton–Schulz,
    row-wise weights orthogonalized on their local columns, and decoupled weight decay."""

    reduce = True
    settings_keys = (*GatheredMuon.settings_keys, "ns_dtype", "ns_coefficients")

    def _apply_update(self, p: DTensor, update: Tensor, group: dict[str, Any]) -> None:
        rows, cols = p.shape
        if tuple(p.placements) == (Shard(1),) and rows <= cols:
            ortho = partial_gram_ns(update, p, group, self.reduce)
        else:
            full = DTensor.from_local(update, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
            ortho = distribute_tensor(
                _gathered_ns(full.full_tensor(), group), p.device_mesh, p.placements, src_data_rank=None
            ).to_local()
        weights = p.to_local().float()
        weights.mul_(1 - group["lr"] * group["weight_decay"])
        weights.add_(ortho.float(), alpha=-group["lr"] * math.sqrt(max(1.0, rows / cols)))
        p.to_local().copy_(weights)


def _gathered_ns(G: Tensor, group: dict[str, Any]) -> Tensor:
    return orthogonalize(
        G, group["ns_steps"], ns_coefficients=group["ns_coefficients"], eps=group["eps"], dtype=group["ns_dtype"]
    )


class LocalGramMuon(GramPartialMuon):
    reduce = False


def gram_partial_muon(param_groups: list[dict[str, Any]], **settings: Any) -> GramPartialMuon:
    return GramPartialMuon(param_groups, **settings)


def gram_partial_local_gram_muon(param_groups: list[dict[str, Any]], **settings: Any) -> LocalGramMuon:
    return LocalGramMuon(param_groups, **settings)


for _factory in (gram_partial_muon, gram_partial_local_gram_muon):
    Candidate(
        conventions={"momentum_form": "sum", "eps_form": "add", "adjust_lr_fn": "original"},
        layouts={"tp"},
        tiers={"gram_partial"},
        features={"bf16"},
    )(_factory)
