"""Cases (what one example is), the strategies that draw them, and the tensors they are made of."""

from harness.cases.case import Case, KernelCase, ParamSpec, candidate_name, optimizer_settings, stored_setting
from harness.cases.strategies import cases, matrix_shapes, muon_settings

__all__ = [
    "Case",
    "KernelCase",
    "ParamSpec",
    "candidate_name",
    "cases",
    "matrix_shapes",
    "muon_settings",
    "optimizer_settings",
    "stored_setting",
]
