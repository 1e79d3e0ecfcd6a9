"""``pytorch-optimizer`` 4.1.0 (``pip install --no-deps pytorch-optimizer==4.1.0``) through the
gates: its ``Muon`` (``--impl examples.pytorch_optimizer_adapter:muon``) and its
``DistributedMuon`` (``--impl examples.pytorch_optimizer_adapter:distributed_muon``).

``Muon`` says it "supports FSDP2 DTensor parameters with eager optimizer steps": it takes the
harness's DTensors as they come. Momentum is elementwise on each rank's piece; each matrix is
gathered whole (``full_tensor``) for Newton–Schulz, and its result laid back out with
``redistribute``, on every rank. ``DistributedMuon`` is written for DDP: it deals the matrices
out to the ranks of the default group and ``all_gather``s the results, so it gets full copies
on every rank, as DDP would give it (``examples.full_copies``); its single-device self is
``Muon``.

Declared as its source has them: EMA momentum (``_foreach_lerp_``), ``eps`` 1e-7 clamping
the norm, Keller's coefficients (``"original"``) in bf16 with ``addmm``, the ``original`` lr
scale (``use_adjusted_lr=False``), decoupled weight decay. bf16 parameters are taken, with
their momentum in the parameter's dtype, and the decay is applied to the weight in its own
dtype before the update (``apply_weight_decay``, then ``p.add_``): ``bf16``, with those known
differences (``bf16_momentum``, ``decay_rounded``), which the cause gate judges. A 3-D parameter is one matrix to it, flattened
to ``[size(0), -1]`` as for a convolution, not a stack of experts: no ``experts``. Its AdamW keeps ``exp_avg_sq`` with ``lerp`` of the
squared gradient, not torch's ``mul_``/``addcmul_``: ``adamw`` is declared anyway, so that the
gates show what that costs. ``DistributedMuon`` gives every parameter without a gradient a zero
one (``init_group``) and so moves it by weight decay, by design.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pytorch_optimizer import DistributedMuon, Muon

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


def muon(param_groups: list[dict[str, Any]], **settings: Any) -> Muon:
    return Muon(_groups(param_groups, settings), foreach=False)


def distributed_muon(param_groups: list[dict[str, Any]], **settings: Any) -> FullCopies:
    return FullCopies(param_groups, lambda groups: DistributedMuon(_groups(groups, settings), foreach=False))


CONVENTIONS = {
    "momentum_form": "ema",
    "eps_form": "clamp",
    "eps": 1e-7,
    "ns_coefficients": "keller",
    "ns_dtype": "bfloat16",
    "adjust_lr_fn": "original",
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
