"""Cases (what one example is), the strategies that draw them, and the tensors they are made of."""

from harness.cases.case import (
    Case,
    Clip,
    KernelCase,
    ParamSpec,
    ReshardCase,
    candidate_name,
    optimizer_settings,
    stored_setting,
)
from harness.cases.strategies import (
    cases,
    clip_cases,
    layout_cases,
    matrix_shapes,
    muon_settings,
    norm_tie_cases,
    replay_cases,
    reshard_cases,
    row_block_cases,
    session_cases,
    settings_of,
    threshold_shapes,
)

__all__ = [
    "Case",
    "Clip",
    "KernelCase",
    "ParamSpec",
    "ReshardCase",
    "candidate_name",
    "cases",
    "clip_cases",
    "layout_cases",
    "matrix_shapes",
    "muon_settings",
    "norm_tie_cases",
    "optimizer_settings",
    "replay_cases",
    "reshard_cases",
    "row_block_cases",
    "session_cases",
    "settings_of",
    "stored_setting",
    "threshold_shapes",
]
