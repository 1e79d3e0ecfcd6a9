"""Dao AI Lab's ``gram-newton-schulz`` 0.1.6 (``pip install --no-deps gram-newton-schulz==0.1.6``)
as a Newton–Schulz kernel: ``--kernel examples.gram_newton_schulz_adapter:gram_newton_schulz``.

``GramNewtonSchulz`` orthogonalizes a non-square matrix through its Gram matrix ``R = X Xᵀ``
(the small side), iterating polynomials of ``R`` and restarting from ``X`` at iteration 2, and a
square one with the standard iteration; both normalize in float32 (``X / (‖X‖ + eps)``) and
then run in **float16**, whatever dtype the input has. Its output is cast back to the input's
dtype.

Which of its code runs here, and only that is judged:

* its **torch backend** (``ns_use_kernels=False``), eager (``compile_kwargs=None``): the
  package's own fallback, which it also takes on CUDA for any matrix with a side below 256;
* **not** its CuTeDSL kernels (``quack-kernels`` and ``nvidia-cutlass-dsl``: CUDA only, and
  ``nvidia-cutlass-dsl-libs-base`` is a 74.5 MB wheel, more than the GPU machine can be sent),
  nor its default ``torch.compile(mode="reduce-overhead")``, which compiles once per shape.

Coefficients: Keller Jordan's quintic on every iteration (its ``ns_coefficients`` takes any
list of triples; its default is a Polar Express schedule of its own, five triples that differ
from the reference's ``polar_express``), so the reference computes the same polynomial.
"""

from __future__ import annotations

import functools

from gram_newton_schulz import GramNewtonSchulz
from torch import Tensor

from harness.candidates import Candidate
from reference.muon import KELLER_COEFFICIENTS


@functools.cache
def _orthogonalizer(steps: int) -> GramNewtonSchulz:
    return GramNewtonSchulz(
        ns_use_kernels=False, ns_coefficients=[list(KELLER_COEFFICIENTS[0])] * steps, compile_kwargs=None
    )


def gram_newton_schulz(matrix: Tensor, steps: int) -> Tensor:
    return _orthogonalizer(steps)(matrix)


Candidate(
    conventions={"ns_coefficients": "keller", "eps_form": "add", "eps": 1e-7},
    package="gram-newton-schulz",
)(gram_newton_schulz)
