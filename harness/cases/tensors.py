"""Every tensor a case is made of, from its seed: the same on every rank and on both sides.

Tensors are drawn on the CPU (so every device gets the same numbers) and only then moved
and sharded. One seed formula serves every draw: the case's seed, a stream (a parameter's
index, or a rank's micro-batch), and the step (``None`` for what exists before the first
step).
"""

from __future__ import annotations

import math
from fractions import Fraction

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
    """The gradient of parameter ``index`` on ``step`` (the full tensor: for ``rank_asymmetric``
    the optimizer task keeps it on rank 0 only)."""
    if spec.grad == "none" or (spec.grad == "every_other" and step % 2 == 1) or (spec.grad == "late" and step == 0):
        return None
    if spec.grad == "zero":
        return torch.zeros(spec.shape, dtype=getattr(torch, spec.dtype))
    if spec.grad == "norm_boundary":
        scale = 2.0 ** round(math.log2(spec.grad_scale))  # a power of two keeps every bit
        g = norm_boundary_matrix(spec.shape, generator(seed, index, step)) * scale
        return g.to(getattr(torch, spec.dtype))
    g = torch.randn(spec.shape, generator=generator(seed, index, step)) * spec.grad_scale
    return g.to(getattr(torch, spec.dtype))


#: how many entries of each matrix ``norm_boundary_matrix`` sets to place its norm
_TUNING_ENTRIES = 6


def _step(x: float, towards: float, dtype: torch.dtype) -> float:
    """The next ``dtype`` value after ``x`` in the direction of ``towards``."""
    return float(torch.nextafter(torch.tensor(x, dtype=dtype), torch.tensor(towards, dtype=dtype)))


def norm_boundary_matrix(shape: tuple[int, ...], gen: torch.Generator) -> Tensor:
    """A float32 matrix (or each matrix of a stack) of bf16-representable entries whose
    Frobenius norm sits where a last-bit difference in a float32 norm survives the cast to
    bf16.

    Let ``lo < hi`` be adjacent bf16 values with ``hi`` even, ``m`` their midpoint (a tie
    that rounds up to ``hi``) and ``u`` float32's spacing at ``m``. The exact sum of squares
    is placed on ``(m − u/2)²`` (within about 2⁻⁴⁰ of it): a float32 norm computed in one
    order lands on ``m − u`` (bf16 ``lo``), in another on ``m`` (bf16 ``hi``). Elsewhere a
    last-bit difference almost never survives: about one case in 2¹⁶ per float32 ULP.

    Random entries first; then a few "tuning" entries (the last of each matrix) chosen
    greedily, largest first, to bring the exact sum of squares to the target; the random
    entries span enough binades that float32 sums of their squares are inexact, hence
    order-dependent. With zero momentum the update equals the gradient, so the norm
    reaches Newton–Schulz unchanged."""
    out = torch.randn(shape, generator=gen, dtype=torch.float32).to(torch.bfloat16).float()
    for m in out.view(-1, *shape[-2:]) if len(shape) > 2 else [out]:
        flat = m.view(-1)
        if flat.numel() <= _TUNING_ENTRIES:
            continue
        tuning = flat.numel() - _TUNING_ENTRIES
        flat[tuning:] = 0.0
        rest = sum((Fraction(v) ** 2 for v in flat[:tuning].tolist()), Fraction(0))
        lo = float(torch.tensor(math.sqrt(float(rest) * 1.25)).to(torch.bfloat16))
        if not int(torch.tensor(lo, dtype=torch.bfloat16).view(torch.int16).item()) & 1:
            lo = _step(lo, math.inf, torch.bfloat16)  # lo odd, so the tie rounds up
        mid = (lo + _step(lo, math.inf, torch.bfloat16)) / 2
        spacing = _step(mid, math.inf, torch.float32) - mid
        residual = (Fraction(mid) - Fraction(spacing) / 2) ** 2 - rest
        signs = torch.randint(0, 2, (_TUNING_ENTRIES,), generator=gen).tolist()
        for k in range(_TUNING_ENTRIES):
            v = float(torch.tensor(math.sqrt(max(float(residual), 0.0))).to(torch.bfloat16))
            while Fraction(v) ** 2 > residual:
                v = _step(v, 0.0, torch.bfloat16)
            residual -= Fraction(v) ** 2
            flat[tuning + k] = -v if signs[k] and v else v  # never -0.0: not this generator's point
    return out


def spectrum_matrix(rows: int, cols: int, gen: torch.Generator) -> Tensor:
    """A float64 matrix with chosen singular values, log-uniform over [0.05, 1].

    A random matrix's near-zero smallest singular value would not reach the quintic's
    band in five steps (it lifts a small value by at most 3.4445⁵ ≈ 480); these do. The
    exact polar factor of this matrix has every singular value 1."""
    k = min(rows, cols)
    u, _ = torch.linalg.qr(torch.randn(rows, k, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(cols, k, generator=gen, dtype=torch.float64))
    return u @ torch.diag(torch.logspace(-1.3, 0, k, dtype=torch.float64)) @ v.T
