"""Gradient-norm clipping written by hand on DTensor pieces, correct and with the bugs reported
in 2026 planted, each declared as the ``clip`` of a candidate that steps with ``ShardedMuon``
(negative controls of the clipping gate, ``gates/test_clip_gates.py``).

``planted_clip`` sums ``|g|ᵖ`` (or takes ``max |g|``) over each rank's piece in float32 and
reduces it over the mesh dims the gradient is sharded on (``Shard``, ``_StridedShard``), and only those: a replicated dim
holds copies, which count once. Then it scales every piece by torch's coefficient. Unplanted,
it is a correct clip that sums in its own order (within the tier, never bitwise). The bugs:

* ``replicas``: the piece's sum reduced over every mesh dim, so a TP-replicated weight, an
  HSDP replica or an expert-replicated vector counts once per copy (Megatron-style code that
  all-reduces over the whole model-parallel group);
* ``tied``: parameters read by ``named_parameters(remove_duplicate=False)``, so a weight tied
  under two names counts twice (the scale is still applied once);
* ``experts``: a 3-D expert stack's sum reduced over its rows' dim only, not over the
  expert-parallel dim, so the norm holds one EP rank's experts.

``known_torch_finding``: the torch finding the clipping gates steer around (the infinity norm on
an empty piece), noted in the example.

QK-clip's controls (``QK_CLIP_CONTROLS``, the QK-clip gate's) plant a bug in muongate's sharded
QK-clip (``distributed_impl.qk_clip``): a rank-local maximum logit, never reduced over the
replicas (they diverge at once); each rank's rows taken as the whole projection's heads; the
master copy left unclipped (``MasterCopyMuon``: an optimizer that keeps its own copy of each
weight, as mixed-precision optimizers keep fp32 masters, and writes the weight from it at every
step, so that a clip of the weight alone is undone by the next step).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import replace
from typing import Any, cast

import torch
import torch.distributed as dist
from hypothesis import note
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from distributed_impl import ShardedMuon
from distributed_impl.qk_clip import batch_max, clip_pair, sharded_qk_clip
from harness.candidates import Candidate
from harness.cases import Case
from harness.layouts import EP_EFSDP, Layout
from harness.replay import local_shapes
from harness.tasks.common import local_of
from reference.clipping import clip_coefficient
from reference.qk_clip import clip_factors


def planted_clip(model: nn.Module, max_norm: float, norm_type: float, bug: str | None = None) -> Tensor:
    """Clips ``model``'s gradients by hand (see the module docstring); returns the total norm."""
    p = float(norm_type)
    infinite = math.isinf(p)
    params = [q for _, q in model.named_parameters(remove_duplicate=bug != "tied")]
    grads = [q.grad for q in params if q.grad is not None]
    total = torch.zeros((), dtype=torch.float32, device=next(model.parameters()).device)
    for g in grads:
        local = local_of(g).float().abs()
        part = (local.amax() if local.numel() else local.new_zeros(())) if infinite else local.pow(p).sum()
        if isinstance(g, DTensor):
            for dim, placement in enumerate(g.placements):
                skip_ep = bug == "experts" and g.ndim == 3 and dim == 0 and g.device_mesh.ndim > 1
                if (not placement.is_replicate() or bug == "replicas") and not skip_ep:
                    op = dist.ReduceOp.MAX if infinite else dist.ReduceOp.SUM
                    dist.all_reduce(part, op=op, group=g.device_mesh.get_group(dim))
        total = torch.maximum(total, part) if infinite else total + part
    norm = total if infinite else total.pow(1.0 / p)
    coefficient = clip_coefficient(norm, max_norm)
    for g in {id(q.grad): q.grad for q in params if q.grad is not None}.values():
        local_of(g).mul_(coefficient)
    return norm


def unplanted_clip(model: nn.Module, max_norm: float, norm_type: float) -> Tensor:
    return planted_clip(model, max_norm, norm_type)


def replicas_clip(model: nn.Module, max_norm: float, norm_type: float) -> Tensor:
    return planted_clip(model, max_norm, norm_type, "replicas")


def tied_clip(model: nn.Module, max_norm: float, norm_type: float) -> Tensor:
    return planted_clip(model, max_norm, norm_type, "tied")


def experts_clip(model: nn.Module, max_norm: float, norm_type: float) -> Tensor:
    return planted_clip(model, max_norm, norm_type, "experts")


def _declared(**fields: Any) -> Candidate:
    """``ShardedMuon``'s declaration with ``fields`` (the planted ``clip`` or ``qk_clip``)."""
    return Candidate(**{**ShardedMuon.muongate, **fields})


@_declared(clip=unplanted_clip)
def UnplantedClipMuon(param_groups: Any, **settings: Any) -> ShardedMuon:
    """``ShardedMuon`` with the hand-written clip, no bug planted."""
    return ShardedMuon(param_groups, **settings)


@_declared(clip=replicas_clip)
def ReplicasClipMuon(param_groups: Any, **settings: Any) -> ShardedMuon:
    """A replicated gradient counted once per copy."""
    return ShardedMuon(param_groups, **settings)


@_declared(clip=tied_clip)
def TiedTwiceClipMuon(param_groups: Any, **settings: Any) -> ShardedMuon:
    """A tied weight counted twice."""
    return ShardedMuon(param_groups, **settings)


@_declared(clip=experts_clip)
def OneEpRankClipMuon(param_groups: Any, **settings: Any) -> ShardedMuon:
    """Expert norms summed over one expert-parallel rank."""
    return ShardedMuon(param_groups, **settings)


@torch.no_grad()
def _local_max_qk_clip(model: nn.Module, pairs: Any, tau: float, alpha: float) -> None:
    """QK-clip from this rank's own maxima, never reduced: each replica clips by its batch alone."""
    for q_name, k_name, observed in pairs:
        q, k = (cast(DTensor, model.get_parameter(name)) for name in (q_name, k_name))
        clip_pair(q, k, observed, tau, alpha)


@torch.no_grad()
def _local_heads_qk_clip(model: nn.Module, pairs: Any, tau: float, alpha: float) -> None:
    """QK-clip with the batch's maxima, each rank's rows split into the head count as if they
    were the whole projection (a stale head count under tensor parallelism)."""
    for q_name, k_name, observed in pairs:
        q, k = (cast(DTensor, model.get_parameter(name)) for name in (q_name, k_name))
        q_factor, k_factor = clip_factors(batch_max(q, observed), tau, alpha)
        for p, factor in ((q, q_factor), (k, k_factor)):
            local = p.to_local()
            rows, heads = local.shape[0], observed.numel()
            if local.numel():
                head = (torch.arange(rows) * heads // rows).clamp(max=heads - 1)
                local.mul_(factor[head].unsqueeze(-1))


@_declared(qk_clip=_local_max_qk_clip)
def LocalMaxQKClipMuon(param_groups: Any, **settings: Any) -> ShardedMuon:
    """QK-clip from a rank-local maximum logit."""
    return ShardedMuon(param_groups, **settings)


@_declared(qk_clip=_local_heads_qk_clip)
def LocalHeadsQKClipMuon(param_groups: Any, **settings: Any) -> ShardedMuon:
    """QK-clip with each rank's rows taken as the whole projection's heads."""
    return ShardedMuon(param_groups, **settings)


#: each ``MasterCopyMuon`` weight's master copy (this rank's piece), by the weight's ``id`` (a
#: tensor is no dictionary key: it compares by value), dropped with the weight
_MASTERS: dict[int, Tensor] = {}


class MasterCopyMuon(ShardedMuon):
    """``ShardedMuon`` that keeps a master copy of each weight beside the model's, as
    mixed-precision optimizers keep fp32 masters (Megatron's, DeepSpeed's): every step starts
    from the masters and writes the weights from them. The copies have the weights' dtype, so
    its arithmetic is ``ShardedMuon``'s; a change made to a weight alone between steps is lost."""

    def __init__(self, params: Any, **settings: Any) -> None:
        super().__init__(params, **settings)
        for p in self._weights():
            _MASTERS[id(p)] = local_of(p).detach().clone()
            weakref.finalize(p, _MASTERS.pop, id(p), None)

    def _weights(self) -> list[Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        for p in self._weights():
            local_of(p).copy_(_MASTERS[id(p)])
        loss = super().step(closure)
        for p in self._weights():
            _MASTERS[id(p)].copy_(local_of(p))
        return loss


@torch.no_grad()
def _masters_qk_clip(model: nn.Module, pairs: Any, tau: float, alpha: float) -> None:
    """muongate's sharded QK-clip of the weights, and of their masters."""
    pairs = list(pairs)
    sharded_qk_clip(model, pairs, tau, alpha)
    for q_name, k_name, _ in pairs:
        for p in (model.get_parameter(q_name), model.get_parameter(k_name)):
            _MASTERS[id(p)].copy_(local_of(p))


@_declared(qk_clip=_masters_qk_clip)
def MasterQKClipMuon(param_groups: Any, **settings: Any) -> MasterCopyMuon:
    """Master copies, each clipped with its weight: no bug planted."""
    return MasterCopyMuon(param_groups, **settings)


@_declared(qk_clip=sharded_qk_clip)
def MasterUnclippedQKClipMuon(param_groups: Any, **settings: Any) -> MasterCopyMuon:
    """Master copies, the weights clipped and their masters not."""
    return MasterCopyMuon(param_groups, **settings)


#: QK-clip's controls
QK_CLIP_CONTROLS: dict[str, Any] = {
    "LocalMaxQKClipMuon": LocalMaxQKClipMuon,
    "LocalHeadsQKClipMuon": LocalHeadsQKClipMuon,
    "MasterUnclippedQKClipMuon": MasterUnclippedQKClipMuon,
}


#: each control, the fewest ranks its bug can show on, and the layout families it is searched
#: on (``None``: every one the clipping gate draws)
CLIP_CONTROLS: dict[str, tuple[Any, int, frozenset[Layout] | None]] = {
    "ReplicasClipMuon": (ReplicasClipMuon, 2, None),
    "TiedTwiceClipMuon": (TiedTwiceClipMuon, 1, None),
    "OneEpRankClipMuon": (OneEpRankClipMuon, 4, frozenset({EP_EFSDP})),
}


def has_empty_piece(case: Case) -> bool:
    """Whether some rank holds an empty piece of a parameter, laid out as the case's layout lays it out."""
    layout = case.layout
    for p in case.params:
        placements = layout.lays_out(p.style, len(p.shape), case.mesh)
        if any(0 in local for _, local in local_shapes(p.shape, case.mesh, placements)):
            return True
    return False


def known_torch_finding(case: Case) -> Case:
    """The 2-norm where torch's infinity norm fails on an empty piece, a torch finding
    (``examples/findings/torch_clip_inf_norm_empty_shard.py``), noted in the example."""
    assert case.clip is not None
    if math.isinf(case.clip.norm_type) and has_empty_piece(case):
        note(f"the 2-norm, not the infinity norm: {INF_ON_EMPTY}")
        return replace(case, clip=case.clip._replace(norm_type=2.0))
    return case


INF_ON_EMPTY = (
    "torch's clip_grad_norm_ fails on a rank whose piece is empty "
    "(examples/findings/torch_clip_inf_norm_empty_shard.py)"
)
