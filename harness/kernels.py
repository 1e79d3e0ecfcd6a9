"""Kernel plug-ins (``--kernel MODULE:FN``): a new Newton–Schulz function through the gates.

The contract, for ``FN``:

* ``FN(matrix, steps) -> matrix``. ``matrix`` is ``[rows, cols]`` or a batch
  ``[..., rows, cols]``, already in the Newton–Schulz dtype (bf16 unless a case says
  fp32); the result has the same shape, in any floating dtype. Any normalization,
  transposition of tall matrices and coefficient schedule are the kernel's business.
* it may declare ``FN.muongate_conventions``: the ``reference.orthogonalize`` settings it
  implements (``ns_coefficients``, ``eps``, ``eps_form``), so that the reference it is
  measured against computes the same mathematics. Anything else is an error that names it.

The gates it meets (``gates/test_kernel_gates.py``):

(a) the sharded optimizer using the kernel against the reference using the same kernel:
    bitwise, as for the built-in Newton–Schulz (the optimizers call it one matrix at a
    time, as the reference does);
(b) the kernel against the reference's Newton–Schulz: the ``kernel_fp32`` tolerance tier
    (tight) and the ``kernel_bf16`` tier (loose: bf16 Newton–Schulz is chaotic), with
    max|diff| and the relative Frobenius error;
(c) quality against float64 mathematics: singular values of its output for inputs with a
    known spread, against the exact polar factor (all ones), and ‖OOᵀ − I‖;
(d) edge inputs (zero, rank-deficient, huge and tiny scale, NaN, Inf): its behaviour must
    be the reference's (finite where the reference is finite, and then within tier;
    non-finite where the reference is), and is reported either way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

import reference
from harness.compare import Tier, compare
from harness.pool import RankContext

KERNEL_CONVENTIONS = frozenset({"ns_coefficients", "eps", "eps_form"})

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

Input = Literal["gaussian", "spectrum", "zero", "rank_deficient", "huge", "tiny", "nan", "inf"]
EDGE_INPUTS: tuple[Input, ...] = ("zero", "rank_deficient", "huge", "tiny", "nan", "inf")


@dataclass(frozen=True)
class Kernel:
    """A kernel's import path and the reference conventions it declared."""

    spec: str
    conventions: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def load(cls, spec: str) -> Kernel:
        from harness.plugins import load_declared

        _, conventions = load_declared("kernel", spec)
        unknown = set(conventions) - KERNEL_CONVENTIONS
        if unknown:
            raise ValueError(
                f"--kernel {spec}: muongate_conventions {sorted(unknown)} are not reference Newton–Schulz "
                f"settings; known: {sorted(KERNEL_CONVENTIONS)}"
            )
        return cls(spec, tuple(sorted(conventions.items())))


@functools.cache
def orthogonalizer(spec: str) -> Callable[..., Tensor]:
    """The kernel behind the reference's ``orthogonalize`` signature, for both optimizers.

    It gets each matrix in the Newton–Schulz dtype, one at a time (a 3-D stack is split),
    so the sharded optimizer and the reference hand it identical inputs."""
    from harness.tasks import load_object

    fn = load_object(spec)

    def run(G: Tensor, steps: int, *, dtype: torch.dtype = torch.bfloat16, **_: Any) -> Tensor:
        if G.ndim == 3:
            if G.shape[0] == 0:  # a shard with no experts
                return G.to(dtype, copy=True)
            return torch.stack([fn(g.to(dtype, copy=True), steps) for g in G.unbind(0)])
        return fn(G.to(dtype, copy=True), steps)

    return run


@dataclass(frozen=True)
class KernelCase:
    """One input for a kernel: its kind, shape, dtype and seed."""

    kernel: Kernel
    shape: tuple[int, ...]
    dtype: str = "bfloat16"
    input: Input = "gaussian"
    steps: int = 5
    seed: int = 0

    def describe(self) -> str:
        return (
            f"KernelCase({self.kernel.spec}, {self.input} input {list(self.shape)}:{self.dtype}, "
            f"steps={self.steps}, seed={self.seed})"
        )


def make_input(case: KernelCase) -> Tensor:
    """The case's input matrix in float64, on the CPU."""
    gen = torch.Generator().manual_seed(case.seed)
    rows, cols = case.shape[-2:]
    g = torch.randn(case.shape, generator=gen, dtype=torch.float64)
    k = min(rows, cols)
    if case.input == "spectrum":  # singular values spread log-uniformly over [0.05, 1]
        u, _ = torch.linalg.qr(torch.randn(rows, k, generator=gen, dtype=torch.float64))
        v, _ = torch.linalg.qr(torch.randn(cols, k, generator=gen, dtype=torch.float64))
        g = u @ torch.diag(torch.logspace(-1.3, 0, k, dtype=torch.float64)) @ v.T
    elif case.input == "zero":
        g = torch.zeros(case.shape, dtype=torch.float64)
    elif case.input == "rank_deficient":  # rank about half the smaller side
        r = max(1, k // 2)
        g = torch.randn(rows, r, generator=gen, dtype=torch.float64) @ torch.randn(
            r, cols, generator=gen, dtype=torch.float64
        )
    elif case.input == "huge":
        g = g * 1e30
    elif case.input == "tiny":
        g = g * 1e-30
    elif case.input == "nan":
        g.view(-1)[g.numel() // 2] = float("nan")
    elif case.input == "inf":
        g.view(-1)[g.numel() // 2] = float("inf")
    return g


def run_kernel_case(ctx: RankContext, payload: tuple[str, KernelCase]) -> dict[str, Any]:
    """The kernel and the reference Newton–Schulz on one input, on this rank's device.

    Returns the comparison record (``KERNEL_TIERS``), both outputs' finiteness, and for
    ``spectrum`` and ``rank_deficient`` inputs the singular values of both outputs and the orthogonality error.
    """
    gate, case = payload
    device = torch.device(ctx.device)
    dtype = getattr(torch, case.dtype)
    g = make_input(case).to(device=device, dtype=dtype)
    got = orthogonalizer(case.kernel.spec)(g, case.steps, dtype=dtype)
    want = reference.orthogonalize(g, case.steps, dtype=dtype, **dict(case.kernel.conventions))
    if got.shape != want.shape:
        raise ValueError(
            f"{case.kernel.spec} returned shape {tuple(got.shape)} for a {tuple(g.shape)} input; "
            f"the reference returns {tuple(want.shape)}"
        )
    tier = KERNEL_TIERS[case.dtype]
    comparison = compare(want, got.to(want.dtype), gate=gate, tensor="output", rank=ctx.rank, tier=tier)
    out: dict[str, Any] = {
        "record": comparison.to_record(),
        "kernel_finite": bool(torch.isfinite(got).all()),
        "reference_finite": bool(torch.isfinite(want).all()),
        "kernel_max_abs": float(got.double().abs().nan_to_num(nan=float("inf")).max()) if got.numel() else 0.0,
    }
    if case.input in ("spectrum", "rank_deficient") and out["kernel_finite"] and out["reference_finite"]:
        out["kernel_sv"] = torch.linalg.svdvals(got.double().cpu()).tolist()
        out["reference_sv"] = torch.linalg.svdvals(want.double().cpu()).tolist()
        o = got.double().cpu()
        gram = o @ o.T if o.shape[0] <= o.shape[1] else o.T @ o
        out["orthogonality_error"] = float(torch.linalg.matrix_norm(gram - torch.eye(gram.shape[0]), ord=2))
    return out
