"""Comparing two tensors: the figures every gate reports, and the verdict by tier.

``bitwise`` means the same bits: the tensors are compared as integers, so -0.0 and +0.0
differ and two NaNs are equal only with the same payload. ``torch.equal`` would call
-0.0 equal to +0.0 and every NaN unequal, so it is not used for the verdict.

A tolerance is never implicit: it is a named ``Tier`` with a bound and a written reason,
and every ``Comparison`` (``reports.records``) carries the tier it was judged by.

Two tensors of different dtypes or shapes are a finding, not a crash: different dtypes
are compared after casting the candidate's to the reference's, and the comparison fails
and says so; different shapes cannot be compared element by element and fail, naming both.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from reports.records import Comparison, TierKind


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

#: For an update whose Newton–Schulz takes X Xᵀ from per-rank partial products and an
#: all-reduce (a column-sharded weight, never gathered): another summation order, so never
#: bitwise. Measured on gloo, 2 ranks, as relative Frobenius error of the whole update
#: against the reference's, five iterations of Keller's coefficients (Polar Express's
#: steeper ones are not calibrated), on the gate's own cases (``_rowwise_cases``):
#: ``examples/gram_partial_muon.py`` on 2,000 cases at worst 1.9e-6 (fp32 Newton–Schulz)
#: and 0.064 (bf16); its variant with the Gram left local on 500 cases at best 0.27 (fp32)
#: and 0.19 (bf16), where every piece has a column (else there is nothing to sum). Each
#: bound sits between: bf16's 1.7× from either side, fp32's 5× above the worst correct.
#: (On whole random matrices of 4+ rows the bands were 1.3e-6 / 0.025 and 0.27 / 0.27; with
#: one iteration bf16's were 0.0019 and 0.021, which these bounds would not separate.)
GRAM_PARTIAL = {
    "float32": Tier("gram_partial_fp32", "tolerance", "Gram partial products, fp32: correct ≤ 1.9e-6, wrong ≥ 0.27",
                    max_rel_fro=1e-5),
    "bfloat16": Tier("gram_partial_bf16", "tolerance", "Gram partial products, bf16: correct ≤ 0.064, wrong ≥ 0.19",
                     max_rel_fro=0.11),
}  # fmt: skip

#: A gradient norm summed in another order than one device's (per piece, then across ranks;
#: torch in the gradients' dtype), against the float64 norm of the full gradients
#: (``reference.clipping.grad_norm``), both rounded to float32, as relative error, by the
#: case's lowest-precision gradient dtype. Measured with ``examples/clip_norm_calibration.py``
#: on the clipping gate's own cases (2- and 1-norm), gloo, 300 cases at 2 ranks and 300 at 4
#: (2-core) and 300 at 8 (the GPU machine's CPUs): torch's ``clip_grad_norm_`` and a hand-written
#: clip land at worst 3.8e-7 (fp32) and 0.0067 (bf16: torch takes each norm in bf16). The wrong
#: variants (a replica counted per copy, a tied weight twice, experts over one EP rank) lie at a
#: median of 0.34 to 1; the few nearer are bugs that moved the norm by less than its own rounding
#: (a tied 1e-3 gradient beside a 1e3 one), which no tier can tell. Each bound is about 3 to 5
#: times the worst correct, for tensors of the drawn sizes; ``clip_norm_tier`` widens it with the
#: largest tensor's size.
CLIP_NORM = {
    "float32": Tier("clip_norm_fp32", "tolerance", "gradient norm, fp32 gradients: correct ≤ 3.8e-7, wrong median ≥ 0.34",
                    rtol=2e-6),
    "bfloat16": Tier("clip_norm_bf16", "tolerance", "gradient norm, bf16 gradients: correct ≤ 0.0067, wrong median ≥ 0.34",
                     rtol=0.02),
}  # fmt: skip


def clip_norm_tier(dtype: str, numel: int) -> Tier:
    """``CLIP_NORM[dtype]``, widened for a tensor of ``numel`` elements: torch's float32 norm on the
    CPU drifts from the true one as a tensor grows, at worst (20 random tensors a size, scales
    1e-3 to 1e3) 2.4e-6 at 2e5 elements, 1.9e-5 at 1e6, 1.9e-4 at 5e6 and 1.5e-3 at 2e7, about
    2.4e-6·(n / 2e5)^1.4. The bound is 3 times that (extrapolated past 2e7 elements), where it
    is above the drawn cases' own; a replayed real model's layout (``--layout-from``) meets it:
    torch's norm of the 16-rank Llama capture, replayed on 2 ranks (4.8 million elements, the
    largest tensor 2.0 million), lay 8.6e-6 from the true one, above the drawn cases' 2e-6."""
    base = CLIP_NORM[dtype]
    grown = 3 * 2.4e-6 * (numel / 2e5) ** 1.4
    if grown <= base.rtol:
        return base
    reason = f"{base.reason}; widened for {numel:,} elements to 3 × 2.4e-6·(n / 2e5)^1.4 (measured to 2e7)"
    return Tier(base.name, "tolerance", reason, rtol=grown)


_INT_VIEW = {
    torch.float32: torch.int32,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.float64: torch.int64,
}


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
    tensor: str,
    step: int = 0,
    rank: int = 0,
    tier: Tier = BITWISE,
    start: Tensor | None = None,
) -> Comparison:
    """Computes every figure for ``actual`` against ``expected`` and judges it by ``tier``.
    ``start``: the tensor's value before the first step, so that a difference can be set
    against how far the expected tensor moved (``Comparison.change_norm``)."""
    e = expected.detach().cpu()
    a = actual.detach().cpu()
    make = functools.partial(
        Comparison, tensor=tensor, step=step, rank=rank, tier=tier.name, tier_kind=tier.kind, dtype=_name(e.dtype)
    )
    if e.shape != a.shape:
        note = f"shape {list(a.shape)}, the reference's {list(e.shape)}: not comparable element by element"
        return make(shape=tuple(a.shape), bitwise=False, passed=False, max_abs_diff=float("inf"), note=note)
    recast = ""
    if a.dtype != e.dtype:
        recast = f"dtype {_name(a.dtype)}, the reference's {_name(e.dtype)}: compared after casting to {_name(e.dtype)}"
        a = a.to(e.dtype)
    shape = tuple(e.shape)
    if e.numel() == 0:
        return make(shape=shape, bitwise=not recast, passed=not recast, note=recast or "empty shard")
    int_dtype = _INT_VIEW[e.dtype]
    # Raw bits decide: -0.0 and +0.0 are distinct here though 0 ULP apart.
    e_bits, a_bits = e.contiguous().view(int_dtype), a.contiguous().view(int_dtype)
    change = float(torch.linalg.vector_norm(e.double() - start.detach().cpu().double())) if start is not None else 0.0
    if torch.equal(e_bits, a_bits) and not recast:  # the common case, and the cheap one
        all_zero = not bool(e_bits.any())
        note = "both all zero: compares nothing" if all_zero else ""
        return make(shape=shape, all_zero=all_zero, note=note, change_norm=change)
    differs = e_bits != a_bits
    mismatches = int(differs.sum())
    ulp = (ordered_bits(e) - ordered_bits(a)).abs().to(torch.float64)
    nan_mismatch = (e.isnan() | a.isnan()) & differs
    ulp[nan_mismatch] = float("inf")
    # A NaN against a number (or a NaN of another payload) differs by NaN, as the subtraction
    # says, not by inf: inf is a difference a number can have, and the report would read as one.
    diff = (e.double() - a.double()).abs()
    diff[~differs] = 0.0
    worst = int(torch.argmax(torch.where(differs, ulp, torch.full_like(ulp, -1.0))).item()) if mismatches else None
    flat_e, flat_a = e.reshape(-1), a.reshape(-1)
    all_zero = bool((flat_e == 0).all() and (flat_a == 0).all())
    max_abs = float(diff.max())
    max_ulp = float(ulp.max()) if mismatches else 0.0
    ref_norm = float(torch.linalg.vector_norm(e.double()))
    gap = float(torch.linalg.vector_norm(torch.where(differs, e.double() - a.double(), 0.0)))
    rel_fro = gap / ref_norm if ref_norm > 0 else (0.0 if gap == 0 else float("inf"))
    bitwise = mismatches == 0 and not recast
    if tier.kind == "bitwise":
        passed = bitwise
    else:
        within = max_abs <= tier.atol + tier.rtol * float(e.double().abs().max())
        if tier.max_ulp is not None:
            within = within or max_ulp <= tier.max_ulp
        if tier.max_rel_fro is not None:
            within = within or rel_fro <= tier.max_rel_fro
        passed = bitwise or (within and not bool(nan_mismatch.any()) and not recast)
    notes = [n for n in (recast, _zeros_note(flat_e, flat_a, differs.reshape(-1), all_zero)) if n]
    return make(
        shape=shape,
        bitwise=bitwise,
        passed=passed,
        max_abs_diff=max_abs,
        max_ulp=max_ulp,
        mismatches=mismatches,
        rel_fro=rel_fro,
        worst_index=tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), e.shape))
        if worst is not None
        else None,
        expected_at_worst=float(flat_e[worst]) if worst is not None else None,
        actual_at_worst=float(flat_a[worst]) if worst is not None else None,
        all_zero=all_zero,
        note="; ".join(notes),
        diff_norm=gap,
        change_norm=change,
    )


def _zeros_note(e: Tensor, a: Tensor, differs: Tensor, all_zero: bool) -> str:
    """What a failed comparison's zeros say. Where both sides hold a zero of other signs the
    values are equal and the bits are not: said, with how many of each, so that a verdict of
    ``max|diff| 0, max ULP 0`` reads as what it is (a tensor all zero in value is then not
    one that "compares nothing": its sign bits were compared, and differ). Both all zero
    with the same bits (a comparison failed only by its dtype): it compares nothing."""
    signed = differs & (e == 0) & (a == 0)
    count = int(signed.sum())
    if not count:
        return "both all zero: compares nothing" if all_zero else ""
    negative = int((signed & torch.signbit(e)).sum())
    each = (("-0.0", "+0.0", negative), ("+0.0", "-0.0", count - negative))
    pairs = [f"{x} against {y} at {n} element{'s' if n != 1 else ''}" for x, y, n in each if n]
    where = "zero in value" if all_zero else f"{count} of {int(differs.sum())} differing elements zero in value"
    return f"{where}, sign bits differ: {', '.join(pairs)}"


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
