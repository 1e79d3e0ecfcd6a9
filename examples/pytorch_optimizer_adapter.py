"""``pytorch-optimizer`` 4.1.0 (``pip install --no-deps pytorch-optimizer==4.1.0``) through the
gates: its ``Muon`` (``--impl examples.pytorch_optimizer_adapter:muon``), its ``DistributedMuon``
(``…:distributed_muon``), its ``NorMuon`` (``…:normuon``, and ``…:normuon_rms`` with
``update_scale="match_rms"``), judged against ``reference.NorMuon``, and its ``MuonClip``
(``…:muon_clip``): its Muon step (momentum summed, no Nesterov, Moonlight's lr scale) and its
QK-clip, declared as ``Candidate.qk_clip`` (``muon_clip_qk_clip``: the package's own clipping
code, handed the maxima reduced over the mesh, as its ``step`` asks its caller to).

``Muon`` says it "supports FSDP2 DTensor parameters with eager optimizer steps": it takes the
harness's DTensors as they come. Momentum is elementwise on each rank's piece; each matrix is
gathered whole (``full_tensor``) for Newton–Schulz, and its result laid back out with
``redistribute``, on every rank. ``DistributedMuon`` is written for DDP: it deals the matrices
out to the ranks of the default group and ``all_gather``s the results, so it gets full copies
on every rank, as DDP would give it (``examples.full_copies``); its single-device self is
``Muon``. ``NorMuon`` claims no DTensors and raises on them (``update.norm().add_(eps)`` in
place on a pending reduction: ``examples/findings/pytorch_optimizer_normuon_dtensor.py``), so
it gets full copies too.

Declared as its source has them: EMA momentum (``_foreach_lerp_``), ``eps`` 1e-7 clamping
the norm, Keller's coefficients (``"original"``) in bf16 with ``addmm``, the ``original`` lr
scale (``use_adjusted_lr=False``), decoupled weight decay. bf16 parameters are taken, with
their momentum in the parameter's dtype, and the decay is applied to the weight in its own
dtype before the update (``apply_weight_decay``, then ``p.add_``): ``bf16``, with those known
differences (``bf16_momentum``, ``decay_rounded``), which the cause gate judges. A 3-D parameter is one matrix to it, flattened
to ``[size(0), -1]`` as for a convolution, not a stack of experts: no ``experts``. Its AdamW
groups keep ``exp_avg_sq`` by ``lerp`` of the squared gradient (``adamw_form="lerp"``) and
bias-correct by the group's step count (``group["step"]``, ``adamw_steps="group"``), so a
parameter's first gradient at step 5 is corrected as a fifth step. ``DistributedMuon`` gives every parameter without a gradient a zero
one (``init_group``) and so moves it by weight decay, by design.

Its ``NorMuon`` follows the authors: statistics per row, ``√v + eps`` (``eps`` 1e-10), the
Frobenius norm kept (or an RMS of 0.2); its Newton–Schulz returns a tall matrix as the
transpose of the wide one it iterated on, and the statistics and norms are summed in that
layout (``normuon_tall="transposed"``). Its ``v`` is kept in the parameter's dtype, where the
reference keeps float32, and NorMuon's family declares no cause for that: no ``bf16``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from pytorch_optimizer import DistributedMuon, Muon, MuonClip, NorMuon
from torch import Tensor, nn

import reference
from distributed_impl.qk_clip import batch_max
from examples.full_copies import LAYOUTS, FullCopies
from harness.candidates import Candidate


def _groups(param_groups: list[dict[str, Any]], settings: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for g in param_groups:
        if g["use_muon"]:
            extra = {"lr": settings["lr"], "momentum": settings["momentum"], "nesterov": settings["nesterov"],
                     "weight_decay": settings["weight_decay"], "ns_steps": settings["ns_steps"]}  # fmt: skip
        else:
            extra = {"lr": settings["adamw_lr"], "betas": settings["adamw_betas"], "eps": settings["adamw_eps"],
                     "weight_decay": settings["adamw_weight_decay"]}  # fmt: skip
        out.append({"params": list(g["params"]), "use_muon": g["use_muon"], **extra})
    return out


def _normuon_groups(
    param_groups: list[dict[str, Any]], settings: dict[str, Any], update_scale: str
) -> list[dict[str, Any]]:
    out = _groups(param_groups, settings)
    for g in out:
        if g["use_muon"]:
            g.update(beta2=settings["beta2"], eps=settings["normuon_eps"], update_scale=update_scale)
    return out


def muon(param_groups: list[dict[str, Any]], **settings: Any) -> Muon:
    return Muon(_groups(param_groups, settings), foreach=False)


def distributed_muon(param_groups: list[dict[str, Any]], **settings: Any) -> FullCopies:
    return FullCopies(param_groups, lambda groups: DistributedMuon(_groups(groups, settings), foreach=False))


def normuon_single_device(param_groups: list[dict[str, Any]], **settings: Any) -> NorMuon:
    """Its ``NorMuon`` as it ships (``update_scale="preserve_norm"``), on whole tensors."""
    return NorMuon(_normuon_groups(param_groups, settings, "preserve_norm"), foreach=False)


def normuon_rms_single_device(param_groups: list[dict[str, Any]], **settings: Any) -> NorMuon:
    """Its ``NorMuon`` with ``update_scale="match_rms"`` (the paper's RMS of 0.2), on whole tensors."""
    return NorMuon(_normuon_groups(param_groups, settings, "match_rms"), foreach=False)


def normuon(param_groups: list[dict[str, Any]], **settings: Any) -> FullCopies:
    """Its ``NorMuon`` on full copies, as DDP gives them: it takes no DTensors (module docstring)."""
    return FullCopies(param_groups, lambda groups: normuon_single_device(groups, **settings))


def normuon_rms(param_groups: list[dict[str, Any]], **settings: Any) -> FullCopies:
    """``normuon`` with ``update_scale="match_rms"``."""
    return FullCopies(param_groups, lambda groups: normuon_rms_single_device(groups, **settings))


def muon_clip(param_groups: list[dict[str, Any]], **settings: Any) -> MuonClip:
    """Its ``MuonClip``'s Muon step (the QK-clip is ``muon_clip_qk_clip``, which the gates call)."""
    groups = [{k: v for k, v in g.items() if k != "nesterov"} for g in _groups(param_groups, settings)]
    return MuonClip(groups, use_adjusted_lr=True, foreach=False)


class _WithoutStep(Muon):
    """A Muon whose step does nothing."""

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        return None


class _QKClipOnly(MuonClip, _WithoutStep):
    """``MuonClip.step`` calls ``super().step()`` and then clips; with ``_WithoutStep`` next in
    line, its step is its own QK-clip code alone."""


@torch.no_grad()
def muon_clip_qk_clip(model: nn.Module, pairs: list[tuple[str, str, Tensor]], tau: float, alpha: float) -> None:
    """Its ``MuonClip``'s QK-clip of each ``(query, key, this rank's maxima)``: the maxima are first
    reduced over every rank of the projections' mesh (muongate's ``batch_max``), as its ``step``
    asks its caller to, and then handed to its own clipping code (``_QKClipOnly``)."""
    for q_name, k_name, observed in pairs:
        q, k = model.get_parameter(q_name), model.get_parameter(k_name)
        largest = batch_max(q, observed)
        groups = [
            {"params": [q], "use_muon": True, "qk_clip": "query", "attention_name": "attention"},
            {"params": [k], "use_muon": True, "qk_clip": "key", "attention_name": "attention"},
        ]
        clip = _QKClipOnly(groups, qk_clip_threshold=tau, qk_clip_alpha=alpha, foreach=False)
        clip.step(attention_max_logits={"attention": largest})


CONVENTIONS = {
    "momentum_form": "ema",
    "eps_form": "clamp",
    "eps": 1e-7,
    "ns_coefficients": "keller",
    "ns_dtype": "bfloat16",
    "adjust_lr_fn": "original",
    # its AdamW groups: v by lerp, bias-corrected by the group's step count
    "adamw_form": "lerp",
    "adamw_steps": "group",
}
_DECLARED = Candidate(
    conventions=CONVENTIONS,
    features={"adamw", "bf16"},
    layouts=LAYOUTS,
    package="pytorch-optimizer",
    differences={"bf16_momentum", "decay_rounded"},
)
_DECLARED(muon)
dataclasses.replace(_DECLARED, single_device=muon, default_group=True)(distributed_muon)

#: its NorMuon: Muon's conventions above, then the authors' (statistics per row, ``√v + eps``)
NORMUON_CONVENTIONS = {
    **CONVENTIONS,
    "normuon_axis": "rows",
    "normuon_denominator": "add",
    "normuon_tall": "transposed",
}
_NORMUON = Candidate(
    reference=reference.NorMuon,
    conventions={**NORMUON_CONVENTIONS, "normuon_scale": "frobenius"},
    features={"adamw"},
    layouts=LAYOUTS,
    package="pytorch-optimizer",
)
dataclasses.replace(_NORMUON, single_device=normuon_single_device)(normuon)
_RMS = dataclasses.replace(_NORMUON, conventions={**NORMUON_CONVENTIONS, "normuon_scale": "rms"})
dataclasses.replace(_RMS, single_device=normuon_rms_single_device)(normuon_rms)

#: its MuonClip's Muon: momentum summed (``m·buf + g``), no Nesterov, Moonlight's lr scale
_MUON_CLIP = Candidate(
    conventions={**CONVENTIONS, "momentum_form": "sum", "nesterov": False, "adjust_lr_fn": "match_rms_adamw"},
    features={"adamw"},
    layouts=LAYOUTS,
    package="pytorch-optimizer",
    qk_clip=muon_clip_qk_clip,
)
_MUON_CLIP(muon_clip)
