"""Single-device references: Muon (+ AdamW for everything that is not a hidden matrix) and AdamW."""

from reference.adamw import ADAMW_DEFAULTS, AdamW, adam_step, init_adam_state, validate_adamw_settings
from reference.muon import (
    MUON_DEFAULTS,
    Interval,
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
    "ADAMW_DEFAULTS",
    "MUON_DEFAULTS",
    "AdamW",
    "Interval",
    "Muon",
    "adam_step",
    "adamw_update",
    "apply_update",
    "coefficient_schedule",
    "group_orthogonalizer",
    "init_adam_state",
    "lr_scale",
    "momentum_update",
    "orthogonalize",
    "orthogonalize_batch",
    "param_names",
    "validate_adamw_settings",
    "validate_settings",
]
