"""Every tensor a case is made of, from its seed: the same on every rank and on both sides.

Tensors are drawn on the CPU (so every device gets the same numbers) and only then moved
and sharded. One seed formula serves every draw: the case's seed, a stream (a parameter's
index, or a rank's micro-batch), and the step (``None`` for what exists before the first
step).
"""

from __future__ import annotations

import torch
from torch import Tensor

from harness.cases.case import ParamSpec


def generator(seed: int, stream: int = 0, step: int | None = None) -> torch.Generator:
    """A CPU generator for one draw of a case; see the module docstring."""
    return torch.Generator().manual_seed(seed * 1_000_003 + stream + 7919 * (0 if step is None else step + 1))


def initial_param(spec: ParamSpec, seed: int, index: int) -> Tensor:
    """Parameter ``index``'s initial value."""
    return torch.randn(spec.shape, generator=generator(seed, index)).to(getattr(torch, spec.dtype))


def gradient(spec: ParamSpec, seed: int, index: int, step: int) -> Tensor | None:
    """The gradient of parameter ``index`` on ``step``."""
    if spec.grad == "none" or (spec.grad == "every_other" and step % 2 == 1):
        return None
    if spec.grad == "zero":
        return torch.zeros(spec.shape, dtype=getattr(torch, spec.dtype))
    g = torch.randn(spec.shape, generator=generator(seed, index, step)) * spec.grad_scale
    return g.to(getattr(torch, spec.dtype))


def spectrum_matrix(rows: int, cols: int, gen: torch.Generator) -> Tensor:
    """A float64 matrix with chosen singular values, log-uniform over [0.05, 1].

    A random matrix's near-zero smallest singular value would not reach the quintic's
    band in five steps (it lifts a small value by at most 3.4445⁵ ≈ 480); these do. The
    exact polar factor of this matrix has every singular value 1."""
    k = min(rows, cols)
    u, _ = torch.linalg.qr(torch.randn(rows, k, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(cols, k, generator=gen, dtype=torch.float64))
    return u @ torch.diag(torch.logspace(-1.3, 0, k, dtype=torch.float64)) @ v.T
