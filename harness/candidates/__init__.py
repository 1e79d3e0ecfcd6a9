"""What is put through the gates from outside: ``--impl`` optimizers and ``--kernel`` Newton–Schulz functions."""

from harness.candidates.declaration import FEATURES, LAYOUTS, Candidate, declaration_of
from harness.candidates.impl import MISSING_GRADS, Impl, UnsupportedConvention
from harness.candidates.kernel import Kernel, orthogonalizer
from harness.candidates.loading import load_object

__all__ = [
    "FEATURES",
    "LAYOUTS",
    "MISSING_GRADS",
    "Candidate",
    "Impl",
    "Kernel",
    "UnsupportedConvention",
    "declaration_of",
    "load_object",
    "orthogonalizer",
]
