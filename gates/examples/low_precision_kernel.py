"""Two Polar Express kernels that declare float32 and compute below it, as a fast kernel might
by mistake: the kernel gates' precision controls.

``bf16_products``: every matmul's inputs and result in bf16, as a compiled or hand-written
kernel whose tiles accumulate in bf16 does; wrong on any device. ``tf32_products``: the matmuls
with TF32 allowed (``torch.set_float32_matmul_precision("high")``), left on: wrong on a GPU
only (a CPU has no TF32), where the reference's float32 Newton–Schulz is held to float32
matmuls (``harness.ranks.switches``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from gates.examples.polar_express_kernel import polar_express
from reference.muon import POLAR_EXPRESS_COEFFICIENTS, POLAR_EXPRESS_SAFETY


def _bf16_matmul(a: Tensor, b: Tensor) -> Tensor:
    return (a.bfloat16() @ b.bfloat16()).to(a.dtype)


def bf16_products(matrix: Tensor, steps: int) -> Tensor:
    tall = matrix.size(-2) > matrix.size(-1)
    x = matrix.mT if tall else matrix
    x = x / (torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True) * POLAR_EXPRESS_SAFETY + 1e-7)
    for i in range(steps):
        a, b, c = POLAR_EXPRESS_COEFFICIENTS[min(i, len(POLAR_EXPRESS_COEFFICIENTS) - 1)]
        gram = _bf16_matmul(x, x.mT)
        x = a * x + _bf16_matmul(b * gram + c * _bf16_matmul(gram, gram), x)
    return x.mT if tall else x


def tf32_products(matrix: Tensor, steps: int) -> Tensor:
    torch.set_float32_matmul_precision("high")
    return polar_express(matrix, steps)


bf16_products.muongate_conventions = polar_express.muongate_conventions  # type: ignore[attr-defined]
tf32_products.muongate_conventions = polar_express.muongate_conventions  # type: ignore[attr-defined]
