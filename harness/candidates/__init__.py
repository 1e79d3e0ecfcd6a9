"""What is put through the gates from outside: ``--impl`` optimizers and ``--kernel`` Newton–Schulz functions."""

from harness.candidates.impl import FEATURES, Impl, UnsupportedConvention
from harness.candidates.kernel import Kernel, orthogonalizer
from harness.candidates.loading import load_object

__all__ = ["FEATURES", "Impl", "Kernel", "UnsupportedConvention", "load_object", "orthogonalizer"]
