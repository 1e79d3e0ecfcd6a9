"""``torch.optim.Muon`` through the gates: ``--impl examples.torch_muon:torch_muon``.

torch.optim.Muon takes plain 2-D tensors on one device. This adapter bridges it to sharded
parameters the way users do, with full copies (``examples.full_copies``): ``torch.optim.Muon``
(and ``torch.optim.AdamW`` for the other parameters) steps whole copies on every rank, so the
gates judge torch's arithmetic at any world size and layout, and the gather and scatter are
the bridge's (DTensor's own calls).

It declares what it is: torch's conventions; every layout but expert parallelism; no 3-D
parameters (torch refuses them); no checkpoint through DCP (the inner optimizers hold the
copies, not the model's parameters); and bf16 parameters, whose momentum torch keeps in
bf16 where the reference keeps float32 state, and decays in the parameter's dtype before
adding the update (``param.mul_`` then ``param.add_``: a bf16 weight is rounded twice): known
differences (``bf16_momentum``, ``decay_rounded``), not bugs, which the cause gate judges. The
second was found by the bitwise gates' check against the declared causes, when only the
first was declared.

``torch_muon_direct`` is the other way users call it: FSDP2's DTensor parameters handed to
``torch.optim.Muon`` as they are, with no bridge, as its docs' examples hand a model's
parameters. DTensor then runs Newton–Schulz on the sharded matrices itself, its norms and
products reduced across ranks (``examples/findings/torch_muon_fsdp2_direct.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from examples.full_copies import LAYOUTS, FullCopies, Together
from harness.candidates import Candidate


def _inner(groups: list[dict[str, Any]], settings: dict[str, Any]) -> list[torch.optim.Optimizer]:
    """torch.optim.Muon for the Muon group, torch.optim.AdamW for the other."""
    out: list[torch.optim.Optimizer] = []
    for g in groups:
        if g["use_muon"]:
            out.append(
                torch.optim.Muon(
                    g["params"],
                    lr=settings["lr"],
                    weight_decay=settings["weight_decay"],
                    momentum=settings["momentum"],
                    nesterov=settings["nesterov"],
                    ns_steps=settings["ns_steps"],
                    adjust_lr_fn=settings["adjust_lr_fn"],
                )
            )
        else:
            out.append(
                torch.optim.AdamW(
                    g["params"],
                    lr=settings.get("adamw_lr", 3e-4),
                    betas=settings.get("adamw_betas", (0.9, 0.95)),
                    eps=settings.get("adamw_eps", 1e-8),
                    weight_decay=settings.get("adamw_weight_decay", 0.0),
                    foreach=False,
                )
            )
    return out


def torch_muon(param_groups: list[dict[str, Any]], **settings: Any) -> torch.optim.Optimizer:
    return FullCopies(param_groups, lambda groups: _inner(groups, settings))


def torch_muon_direct(param_groups: list[dict[str, Any]], **settings: Any) -> torch.optim.Optimizer:
    return Together(param_groups, _inner(param_groups, settings))


_DECLARED = Candidate(
    conventions={
        "momentum_form": "ema",
        "eps_form": "clamp",
        "eps": 1e-7,
        "ns_coefficients": "keller",
        "ns_dtype": "bfloat16",
        "adjust_lr_fn": "original",
    },
    features={"adamw", "bf16", "checkpoint"},
    layouts=LAYOUTS,
    package="torch",
    differences={"bf16_momentum", "decay_rounded"},
)
_DECLARED(torch_muon_direct)
# full copies: the inner optimizers hold the copies, which a DCP checkpoint of the model does not see
dataclasses.replace(_DECLARED, features={"adamw", "bf16"})(torch_muon)
