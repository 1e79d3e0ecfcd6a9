"""A Polar Express Newton–Schulz kernel, written as another team might: ``--kernel
gates.examples.polar_express_kernel:polar_express`` (the kernel gates' subject without ``--kernel``).

Batched over leading dimensions with ``mT`` and broadcasting matmuls, and the polynomial
in the plain ``a·X + (b·A + c·A·A)·X`` form rather than the reference's ``addmm`` form, so
it rounds differently: it is measured against the reference's ``polar_express``
Newton–Schulz in the ``kernel`` tolerance tier, and is bitwise only against itself.
"""

from __future__ import annotations

import torch
from torch import Tensor

from reference.muon import POLAR_EXPRESS_COEFFICIENTS, POLAR_EXPRESS_SAFETY


def polar_express(matrix: Tensor, steps: int) -> Tensor:
    tall = matrix.size(-2) > matrix.size(-1)
    x = matrix.mT if tall else matrix
    norm = torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True) * POLAR_EXPRESS_SAFETY
    x = x / (norm + 1e-7)
    for i in range(steps):
        a, b, c = POLAR_EXPRESS_COEFFICIENTS[min(i, len(POLAR_EXPRESS_COEFFICIENTS) - 1)]
        gram = x @ x.mT
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x.mT if tall else x


polar_express.muongate_conventions = {"ns_coefficients": "polar_express", "eps_form": "add", "eps": 1e-7}  # type: ignore[attr-defined]
