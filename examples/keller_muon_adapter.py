"""Keller Jordan's ``muon-optimizer`` 0.1.0 (``pip install --no-deps muon-optimizer==0.1.0``,
module ``muon``) through the gates: ``--impl examples.keller_muon_adapter:keller_muon``.

``MuonWithAuxAdam`` is written for DDP: every rank holds every parameter whole, the Muon
matrices (sorted by size) are dealt out to the ranks of the default group, each rank steps
its own, and ``all_gather`` hands the results round. The adapter gives it what DDP would,
full copies on every rank (``examples.full_copies``), so the gates judge the package's own
split and gather, at any world size and layout. ``SingleDeviceMuonWithAuxAdam`` is its
single-device self (``--against self``).

Declared as its source has them: EMA momentum, always Nesterov (a group may not set it) and
always 5 Newton–Schulz steps (``muon_update``'s defaults), ``eps`` 1e-7 added to the norm,
Keller's coefficients in bf16, the ``original`` lr scale. bf16 parameters are taken, with
their momentum in the parameter's dtype (``zeros_like``) and the decay applied to the weight
in its own dtype before the update (``p.mul_``, then ``p.add_``): known differences
(``bf16_momentum``, ``decay_rounded``); 3-D parameters too (``experts``): its Newton–Schulz is batched over the
leading dimensions and the lr scale reads the last two. Its quintic is the plain form
(``B = b·A + c·A@A; X = a·X + B@X``) and its lr scale multiplies the bf16 update in place
before the lr does, neither of which the reference expresses; its Adam divides bias-corrected
moments (``lerp`` of the squared gradient), not torch's AdamW arithmetic, so ``adamw`` is not
declared. Its split uses the default group, so it runs on meshes of the whole world only.
"""

from __future__ import annotations

from typing import Any

from muon import MuonWithAuxAdam, SingleDeviceMuonWithAuxAdam

from examples.full_copies import LAYOUTS, FullCopies
from harness.candidates import Candidate


def _groups(param_groups: list[dict[str, Any]], settings: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "params": list(g["params"]),
            "use_muon": True,
            "lr": settings["lr"],
            "momentum": settings["momentum"],
            "weight_decay": settings["weight_decay"],
        }
        for g in param_groups
        if g["use_muon"]
    ]


def keller_muon(param_groups: list[dict[str, Any]], **settings: Any) -> FullCopies:
    return FullCopies(param_groups, lambda groups: MuonWithAuxAdam(_groups(groups, settings)))


def keller_muon_single_device(param_groups: list[dict[str, Any]], **settings: Any) -> SingleDeviceMuonWithAuxAdam:
    return SingleDeviceMuonWithAuxAdam(_groups(param_groups, settings))


Candidate(
    conventions={
        "momentum_form": "ema",
        "nesterov": True,
        "ns_steps": 5,
        "eps_form": "add",
        "eps": 1e-7,
        "ns_coefficients": "keller",
        "ns_dtype": "bfloat16",
        "adjust_lr_fn": "original",
    },
    features={"experts", "bf16"},
    layouts=LAYOUTS,
    single_device=keller_muon_single_device,
    package="muon-optimizer",
    default_group=True,
    differences={"plain_quintic", "scaled_update", "bf16_momentum", "decay_rounded"},
)(keller_muon)
