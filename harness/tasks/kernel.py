"""The kernel task: a ``--kernel`` and the reference Newton–Schulz on one input, on one rank's device."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

import reference
from harness.candidates.kernel import orthogonalizer
from harness.cases.case import KernelCase, KernelInput
from harness.cases.tensors import generator, spectrum_matrix
from harness.ranks import RankContext
from harness.ranks.switches import held
from harness.tasks.result import TaskResult
from harness.verdicts.compare import Tier, compare

#: A kernel against the reference Newton–Schulz with the same coefficients, by dtype. Measured
#: over 300 random shapes up to 48×48 (CPU): two correct kernels (a Polar Express and a plain-form
#: quintic) against the reference's ``addmm`` form, and a kernel with a wrong normalization.
KERNEL_TIERS = {
    "float32": Tier(
        "kernel_fp32",
        "tolerance",
        "fp32 Newton–Schulz in another kernel rounds in another order, and five steps carry the "
        "differences forward: two correct kernels measured ≤ 7.2e-6 relative Frobenius error, a "
        "wrong normalization ≥ 7e-3; bounded at 1e-4",
        max_rel_fro=1e-4,
    ),
    "bfloat16": Tier(
        "kernel_bf16",
        "tolerance",
        "bf16: the quintic's iteration is chaotic near its attracting cycle, so bf16 roundings in "
        "another order grow to up to 22% relative Frobenius error between two correct kernels; the "
        "bound 0.35 catches divergence and NaN, not subtle bugs (the fp32 tier does)",
        max_rel_fro=0.35,
    ),
}
#: How far a kernel's singular values may stray beyond the reference's on the same input.
BAND_MARGIN = 0.05

EDGE_INPUTS: tuple[KernelInput, ...] = ("zero", "rank_deficient", "huge", "tiny", "nan", "inf")


def make_input(case: KernelCase) -> Tensor:
    """The case's input matrix in float64, on the CPU."""
    gen = generator(case.seed)
    rows, cols = case.shape[-2:]
    if case.input == "spectrum":
        return spectrum_matrix(rows, cols, gen)
    if case.input == "zero":
        return torch.zeros(case.shape, dtype=torch.float64)
    if case.input == "rank_deficient":  # rank about half the smaller side
        r = max(1, min(rows, cols) // 2)
        return torch.randn(rows, r, generator=gen, dtype=torch.float64) @ torch.randn(
            r, cols, generator=gen, dtype=torch.float64
        )
    g = torch.randn(case.shape, generator=gen, dtype=torch.float64)
    if case.input == "huge":
        g = g * 1e30
    elif case.input == "tiny":
        g = g * 1e-30
    elif case.input in ("nan", "inf"):
        g.view(-1)[g.numel() // 2] = float(case.input)
    return g


def run_kernel_case(ctx: RankContext, case: KernelCase) -> TaskResult:
    """The kernel and the reference Newton–Schulz on one input, on this rank's device.

    The comparison is judged in ``KERNEL_TIERS``; the figures say whether each output is
    finite and, for ``spectrum`` and ``rank_deficient`` inputs, both outputs' singular
    values and the kernel's orthogonality error ‖OOᵀ − I‖₂.
    """
    device = torch.device(ctx.device)
    dtype = getattr(torch, case.dtype)
    g = make_input(case).to(device=device, dtype=dtype)
    got = orthogonalizer(case.kernel.spec)(g, case.steps, dtype=dtype)
    with held():  # whatever switch the kernel left on
        want = reference.orthogonalize(g, case.steps, dtype=dtype, **dict(case.kernel.conventions))
    if got.shape != want.shape:
        raise ValueError(
            f"{case.kernel.spec} returned shape {tuple(got.shape)} for a {tuple(g.shape)} input; "
            f"the reference returns {tuple(want.shape)}"
        )
    comparison = compare(want, got.to(want.dtype), tensor="output", rank=ctx.rank, tier=KERNEL_TIERS[case.dtype])
    figures: dict[str, Any] = {
        "kernel_finite": bool(torch.isfinite(got).all()),
        "reference_finite": bool(torch.isfinite(want).all()),
        "kernel_max_abs": float(got.double().abs().nan_to_num(nan=float("inf")).max()) if got.numel() else 0.0,
    }
    if case.input in ("spectrum", "rank_deficient") and figures["kernel_finite"] and figures["reference_finite"]:
        o = got.double().cpu()
        figures["kernel_sv"] = torch.linalg.svdvals(o).tolist()
        figures["reference_sv"] = torch.linalg.svdvals(want.double().cpu()).tolist()
        gram = o @ o.T if o.shape[0] <= o.shape[1] else o.T @ o
        figures["orthogonality_error"] = float(torch.linalg.matrix_norm(gram - torch.eye(gram.shape[0]), ord=2))
    return TaskResult((comparison,), figures)
