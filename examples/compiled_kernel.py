"""Keller Jordan's quintic Newton–Schulz compiled by ``torch.compile`` (Inductor; Triton on
GPUs): ``--kernel examples.compiled_kernel:compiled_ns``.

Compiled with ``dynamic=True`` so the many shapes a gate run draws share one graph rather
than exhausting the recompile limit (after which torch would silently run it eagerly).
On CPU, Inductor needs a C++ compiler; this kernel is meant for the GPU machine.
"""

from __future__ import annotations

import torch
from torch import Tensor

from reference.muon import KELLER_COEFFICIENTS


def _newton_schulz(matrix: Tensor, steps: int) -> Tensor:
    tall = matrix.size(-2) > matrix.size(-1)
    x = matrix.mT if tall else matrix
    x = x / (torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True) + 1e-7)
    ((a, b, c),) = KELLER_COEFFICIENTS
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x.mT if tall else x


_compiled = torch.compile(_newton_schulz, dynamic=True)


def compiled_ns(matrix: Tensor, steps: int) -> Tensor:
    return _compiled(matrix, steps)


compiled_ns.muongate_conventions = {"ns_coefficients": "keller", "eps_form": "add", "eps": 1e-7}  # type: ignore[attr-defined]
