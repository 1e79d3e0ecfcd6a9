"""Kernel plug-ins (``--kernel MODULE:FN``): a new Newton–Schulz function through the gates.

The contract, for ``FN``:

* ``FN(matrix, steps) -> matrix``. ``matrix`` is ``[rows, cols]`` or a batch
  ``[..., rows, cols]``, already in the Newton–Schulz dtype (bf16 unless a case says
  fp32); the result has the same shape, in any floating dtype. Any normalization,
  transposition of tall matrices and coefficient schedule are the kernel's business.
* it may declare ``FN.muongate_conventions``: the ``reference.orthogonalize`` settings it
  implements (``ns_coefficients``, ``eps``, ``eps_form``), so that the reference it is
  measured against computes the same mathematics. Anything else is an error that names it.

The gates it meets (``gates/test_kernel_gates.py``, run by ``harness.tasks.kernel``):

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
from typing import Any

import torch
from torch import Tensor

from harness.candidates.loading import load_declared, load_object

KERNEL_CONVENTIONS = frozenset({"ns_coefficients", "eps", "eps_form"})


@dataclass(frozen=True)
class Kernel:
    """A kernel's import path and the reference conventions it declared."""

    spec: str
    conventions: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def load(cls, spec: str) -> Kernel:
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
    fn = load_object(spec)

    def run(G: Tensor, steps: int, *, dtype: torch.dtype = torch.bfloat16, **_: Any) -> Tensor:
        if G.ndim == 3:
            if G.shape[0] == 0:  # a shard with no experts
                return G.to(dtype, copy=True)
            return torch.stack([fn(g.to(dtype, copy=True), steps) for g in G.unbind(0)])
        return fn(G.to(dtype, copy=True), steps)

    return run
