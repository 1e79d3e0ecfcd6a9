"""``dtensor-muon`` 0.1.0 (``pip install --no-deps dtensor-muon==0.1.0``) through the gates:
``--impl examples.dtensor_muon_adapter:dtensor_muon``.

Its ``Muon`` takes DTensor parameters as they come: momentum on each rank's piece, and each
matrix gathered whole (``full_tensor``) for Newton–Schulz, laid back out with
``redistribute``. Its Newton–Schulz is ``torch.compile``d and builds the Gram matrices with a
Triton kernel of its own (``kernels/gram.py``, imported unconditionally), so it needs
``triton`` and a CUDA device: it declares ``cuda`` only. Its README asks for Python ≥ 3.12
and torch ≥ 2.12.1; CPU CI has Python 3.11 and no triton, the GPU machine torch 2.11.

The adapter turns off what is not Muon (``use_cautious_wd=False``) and picks the classic
iteration (``orthogonalization_strategy="newton_schulz"``: Keller's coefficients). A 3-D
parameter it takes two ways: by default (``flatten=True``) as the one matrix ``[E, m·n]``,
momentum of that shape included; with ``flatten=False`` as a stack of ``E`` matrices, each
orthogonalized and lr-scaled on its own, which is what the reference and ``experts`` mean, so
the adapter passes ``flatten=False`` (the default's 3-D cells on the H200, 2026-12-05: the
momentum buffer ``[2, 470]`` for a ``[2, 47, 10]`` stack, the weight up to 1.06 away at lr 0.5). Declared
as its source has them: momentum as a sum (``buf·μ + g``), ``eps`` 1e-7 added to the norm, bf16
Newton–Schulz, the ``original`` lr scale, float32 momentum. Its quintic is the plain form,
compiled (``torch.compile``) with a Triton Gram: declared as ``fused_quintic``, since Inductor
computes each fused elementwise step in float32 and rounds it once (on the H200 the
normalization alone, at ``ns_steps=0``, was 0.00069 to 0.0039 of the update from the eager
plain form's, 10 times past its tier, before this was declared). Its weight decay is added to
the update, so scaled by the lr scale as well (``p − lr·scale·(u + wd·p)``); the reference
expresses neither.
"""

from __future__ import annotations

from typing import Any

from dtensor_muon import Muon

from harness.candidates import Candidate


def dtensor_muon(param_groups: list[dict[str, Any]], **settings: Any) -> Muon:
    groups = []
    for g in param_groups:
        if g["use_muon"]:
            groups.append({"params": list(g["params"]), "algorithm": "muon", "flatten": False})
        else:
            groups.append({"params": list(g["params"]), "algorithm": "adamw", "lr": settings["adamw_lr"],
                           "wd": settings["adamw_weight_decay"], "betas": settings["adamw_betas"],
                           "eps": settings["adamw_eps"]})  # fmt: skip
    return Muon(
        groups,
        lr=settings["lr"],
        wd=settings["weight_decay"],
        use_cautious_wd=False,
        momentum=settings["momentum"],
        nesterov=settings["nesterov"],
        ns_steps=settings["ns_steps"],
        orthogonalization_strategy="newton_schulz",
    )


Candidate(
    conventions={
        "momentum_form": "sum",
        "eps_form": "add",
        "eps": 1e-7,
        "ns_coefficients": "keller",
        "ns_dtype": "bfloat16",
        "adjust_lr_fn": "original",
    },
    features={"adamw", "experts", "bf16"},
    layouts={"hsdp", "tp", "fsdp_tp", "hsdp_tp"},
    devices={"cuda"},
    package="dtensor-muon",
    differences={"fused_quintic"},
)(dtensor_muon)
