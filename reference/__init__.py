"""Single-device references: Muon (+ AdamW for everything that is not a hidden matrix), NorMuon, AdamW,
AdamW with block-quantized moments (``LowBitAdamW``) and Adafactor."""

from reference.adafactor import ADAFACTOR_DEFAULTS, Adafactor, adafactor_step, validate_adafactor_settings
from reference.adamw import ADAMW_DEFAULTS, AdamW, adam_step, init_adam_state, validate_adamw_settings
from reference.lowbit import LOWBIT_DEFAULTS, QUANTIZED, LowBitAdamW, lowbit_adam_step, quantized
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
    unit_shape,
    validate_settings,
)
from reference.normuon import NORMUON_DEFAULTS, NorMuon, normalize_neurons, second_moment_shape

__all__ = [
    "ADAFACTOR_DEFAULTS",
    "ADAMW_DEFAULTS",
    "LOWBIT_DEFAULTS",
    "MUON_DEFAULTS",
    "NORMUON_DEFAULTS",
    "QUANTIZED",
    "Adafactor",
    "AdamW",
    "Interval",
    "LowBitAdamW",
    "Muon",
    "NorMuon",
    "adafactor_step",
    "adam_step",
    "adamw_update",
    "apply_update",
    "coefficient_schedule",
    "group_orthogonalizer",
    "init_adam_state",
    "lowbit_adam_step",
    "lr_scale",
    "momentum_update",
    "normalize_neurons",
    "orthogonalize",
    "orthogonalize_batch",
    "param_names",
    "quantized",
    "second_moment_shape",
    "unit_shape",
    "validate_adafactor_settings",
    "validate_adamw_settings",
    "validate_settings",
]
