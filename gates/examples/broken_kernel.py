"""A deliberately broken Newton–Schulz kernel: ``--kernel gates.examples.broken_kernel:row_norm_ns``
must fail the kernel gates (their negative control).

It normalizes by the largest row norm instead of the Frobenius norm: right for a single
row (where the two agree), wrong as soon as there are two, because the spectral norm can
then exceed 1 and the quintic leaves its basin. The gates must catch it and shrink the
failure to a small matrix.
"""

from __future__ import annotations

import torch
from torch import Tensor

from reference.muon import KELLER_COEFFICIENTS


def row_norm_ns(matrix: Tensor, steps: int) -> Tensor:
    tall = matrix.size(-2) > matrix.size(-1)
    x = matrix.mT if tall else matrix
    x = x / (torch.linalg.vector_norm(x, dim=-1, keepdim=True).amax(dim=-2, keepdim=True) + 1e-7)
    ((a, b, c),) = KELLER_COEFFICIENTS
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x.mT if tall else x


row_norm_ns.muongate_conventions = {"ns_coefficients": "keller"}  # type: ignore[attr-defined]
