"""NVIDIA's ``emerging-optimizers`` 0.3.0 (``pip install --no-deps emerging-optimizers==0.3.0
absl-py``; it needs Python ≥ 3.12) through the gates: its ``Muon``,
``--impl examples.emerging_optimizers_adapter:muon``.

Its ``Muon`` takes plain 2-D tensors on one device (its tensor-parallel Newton–Schulz,
``newton_schulz_tp``, is a function for a caller that holds a TP process group, not an
optimizer for DTensor parameters), so the adapter bridges it with full copies
(``examples.full_copies``), as a user would, and it is its own single-device self.

The adapter picks Keller's coefficients (``coefficient_type="simple"``), Nesterov as the case
draws it, no weight decay inside its mixin (the reference's decoupled decay is its default,
``weight_decay_method="decoupled"``), and the ``original`` lr scale
(``scale_mode="shape_scaling"``). Declared as its source has them: EMA momentum, the norm
clamped at 1e-7 (``F.normalize``), the default ``fp32_matmul_prec="medium"``, which runs
Newton–Schulz in bf16 after normalizing in float32, and the lr scale multiplying the float32
update before the lr (``scaled_update``); momentum in the parameter's dtype. CPU CI has
Python 3.11, so it runs on the GPU machine's Python 3.12.
"""

from __future__ import annotations

from typing import Any

from emerging_optimizers.orthogonalized_optimizers.muon import Muon

from examples.full_copies import LAYOUTS, FullCopies


def _muon(groups: list[dict[str, Any]], settings: dict[str, Any]) -> Muon:
    (group,) = [g for g in groups if g["use_muon"]]
    return Muon(
        group["params"],
        lr=settings["lr"],
        momentum=settings["momentum"],
        weight_decay=settings["weight_decay"],
        nesterov=settings["nesterov"],
        coefficient_type="simple",
        num_ns_steps=settings["ns_steps"],
        scale_mode="shape_scaling",
    )


def muon(param_groups: list[dict[str, Any]], **settings: Any) -> FullCopies:
    return FullCopies(param_groups, lambda groups: _muon(groups, settings))


def muon_single_device(param_groups: list[dict[str, Any]], **settings: Any) -> Muon:
    return _muon(param_groups, settings)


muon.muongate_conventions = {  # type: ignore[attr-defined]
    "momentum_form": "ema",
    "eps_form": "clamp",
    "eps": 1e-7,
    "ns_coefficients": "keller",
    "ns_dtype": "bfloat16",
    "adjust_lr_fn": "original",
}
muon.muongate_features = set()  # type: ignore[attr-defined]
muon.muongate_layouts = LAYOUTS  # type: ignore[attr-defined]
muon.muongate_differences = {"scaled_update"}  # type: ignore[attr-defined]
muon.muongate_single_device = muon_single_device  # type: ignore[attr-defined]
muon.muongate_package = "emerging-optimizers"  # type: ignore[attr-defined]
