"""Single-device reference Muon (+ AdamW for everything that is not a hidden matrix)."""

from reference.muon import (
    MUON_DEFAULTS,
    Muon,
    adamw_update,
    apply_update,
    coefficient_schedule,
    group_orthogonalizer,
    lr_scale,
    momentum_update,
    orthogonalize,
    orthogonalize_batch,
    param_names,
    validate_settings,
)

__all__ = [
    "MUON_DEFAULTS",
    "Muon",
    "adamw_update",
    "apply_update",
    "coefficient_schedule",
    "group_orthogonalizer",
    "lr_scale",
    "momentum_update",
    "orthogonalize",
    "orthogonalize_batch",
    "param_names",
    "validate_settings",
]
