"""Comparing two tensors: the figures every gate reports, and the verdict by tier.

``bitwise`` means the same bits: the tensors are compared as integers, so -0.0 and +0.0
differ and two NaNs are equal only with the same payload. ``torch.equal`` would call
-0.0 equal to +0.0 and every NaN unequal, so it is not used for the verdict.

A tolerance is never implicit: it is a named ``Tier`` with a bound and a written reason,
and every ``Comparison`` carries the tier it was judged by.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
from torch import Tensor

TierKind = Literal["bitwise", "tolerance", "oracle"]


@dataclass(frozen=True)
class Tier:
    """How a comparison is judged. ``max_ulp``, ``atol``/``rtol`` and ``max_rel_fro`` (relative
    Frobenius error ``‖actual − expected‖ / ‖expected‖``) apply to tolerance tiers; a
    tolerance tier passes when any of its bounds holds and no NaN appears where the other
    side has none."""

    name: str
    kind: TierKind
    reason: str
    max_ulp: int | None = None
    atol: float = 0.0
    rtol: float = 0.0
    max_rel_fro: float | None = None


BITWISE = Tier("bitwise", "bitwise", "same math, same kernel, same device: the bits must match")

_INT_VIEW = {
    torch.float32: torch.int32,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.float64: torch.int64,
}


@dataclass(frozen=True)
class Comparison:
    """One tensor of one step on one rank: the figures and the verdict."""

    gate: str
    tensor: str
    step: int
    rank: int
    tier: str
    tier_kind: TierKind
    shape: tuple[int, ...]
    dtype: str
    numel: int
    bitwise: bool
    max_abs_diff: float
    max_ulp: float
    mismatches: int
    mismatch_fraction: float
    worst_index: tuple[int, ...] | None
    expected_at_worst: float | None
    actual_at_worst: float | None
    all_zero: bool
    passed: bool
    note: str = ""
    rel_fro: float = 0.0

    def to_record(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        verdict = "bitwise" if self.bitwise else ("pass" if self.passed else "FAIL")
        where = ""
        if self.worst_index is not None and not self.bitwise:
            where = f" worst at {self.worst_index}: expected {self.expected_at_worst!r} got {self.actual_at_worst!r}"
        return (
            f"{self.tensor} step {self.step} rank {self.rank} [{self.tier}] {verdict}: max|diff| "
            f"{self.max_abs_diff:.3g}, max ULP {self.max_ulp:g}, {self.mismatches}/{self.numel} differ{where}"
            + (f" ({self.note})" if self.note else "")
        )


def ordered_bits(t: Tensor) -> Tensor:
    """Maps floats to int64 so that adjacent representable values differ by 1 (ULP distance)."""
    int_dtype = _INT_VIEW[t.dtype]
    bits = t.contiguous().view(int_dtype).to(torch.int64)
    width = torch.iinfo(int_dtype).bits
    sign_mask = 1 << (width - 1)
    magnitude = bits & (sign_mask - 1)
    return torch.where(bits < 0, -magnitude, magnitude)


def compare(
    expected: Tensor,
    actual: Tensor,
    *,
    gate: str,
    tensor: str,
    step: int = 0,
    rank: int = 0,
    tier: Tier = BITWISE,
) -> Comparison:
    """Computes every figure for ``actual`` against ``expected`` and judges it by ``tier``."""
    if expected.shape != actual.shape or expected.dtype != actual.dtype:
        raise ValueError(
            f"{gate}: {tensor!r} step {step} rank {rank}: expected {expected.dtype} {tuple(expected.shape)}, "
            f"got {actual.dtype} {tuple(actual.shape)}"
        )
    e = expected.detach().cpu()
    a = actual.detach().cpu()
    numel = e.numel()
    if numel == 0:
        return Comparison(
            gate,
            tensor,
            step,
            rank,
            tier.name,
            tier.kind,
            tuple(e.shape),
            str(e.dtype).removeprefix("torch."),
            0,
            True,
            0.0,
            0.0,
            0,
            0.0,
            None,
            None,
            None,
            True,
            True,
            "empty shard",
        )
    int_dtype = _INT_VIEW[e.dtype]
    # Raw bits decide: -0.0 and +0.0 are distinct here though 0 ULP apart.
    e_bits, a_bits = e.contiguous().view(int_dtype), a.contiguous().view(int_dtype)
    if torch.equal(e_bits, a_bits):  # the common case, and the cheap one
        all_zero = not bool(e_bits.any())
        return Comparison(
            gate, tensor, step, rank, tier.name, tier.kind, tuple(e.shape), str(e.dtype).removeprefix("torch."),
            numel, True, 0.0, 0.0, 0, 0.0, None, None, None, all_zero, True,
            "both all zero: compares nothing" if all_zero else "",
        )  # fmt: skip
    differs = e_bits != a_bits
    eb, ab = ordered_bits(e), ordered_bits(a)
    mismatches = int(differs.sum())
    bitwise = mismatches == 0
    ulp = (eb - ab).abs().to(torch.float64)
    nan_mismatch = (e.isnan() | a.isnan()) & differs
    ulp[nan_mismatch] = float("inf")
    diff = (e.double() - a.double()).abs()
    diff[~differs] = 0.0
    diff[nan_mismatch] = float("inf")
    worst = int(torch.argmax(torch.where(differs, ulp, torch.full_like(ulp, -1.0))).item()) if mismatches else None
    worst_index = (
        tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), e.shape)) if worst is not None else None
    )
    flat_e, flat_a = e.reshape(-1), a.reshape(-1)
    all_zero = bool((flat_e == 0).all() and (flat_a == 0).all())
    max_abs = float(diff.max())
    max_ulp = float(ulp.max()) if mismatches else 0.0
    ref_norm = float(torch.linalg.vector_norm(e.double()))
    gap = float(torch.linalg.vector_norm(torch.where(differs, e.double() - a.double(), 0.0)))
    rel_fro = gap / ref_norm if ref_norm > 0 else (0.0 if gap == 0 else float("inf"))
    if tier.kind == "bitwise":
        passed = bitwise
    else:
        within = max_abs <= tier.atol + tier.rtol * float(e.double().abs().max())
        if tier.max_ulp is not None:
            within = within or max_ulp <= tier.max_ulp
        if tier.max_rel_fro is not None:
            within = within or rel_fro <= tier.max_rel_fro
        passed = bitwise or (within and not bool(nan_mismatch.any()))
    return Comparison(
        gate=gate,
        tensor=tensor,
        step=step,
        rank=rank,
        tier=tier.name,
        tier_kind=tier.kind,
        shape=tuple(e.shape),
        dtype=str(e.dtype).removeprefix("torch."),
        numel=numel,
        bitwise=bitwise,
        max_abs_diff=max_abs,
        max_ulp=max_ulp,
        mismatches=mismatches,
        mismatch_fraction=mismatches / numel,
        worst_index=worst_index,
        expected_at_worst=float(flat_e[worst]) if worst is not None else None,
        actual_at_worst=float(flat_a[worst]) if worst is not None else None,
        all_zero=all_zero,
        passed=passed,
        note="both all zero: compares nothing" if all_zero else "",
        rel_fro=rel_fro,
    )
