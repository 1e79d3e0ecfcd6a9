"""What ``gram-newton-schulz`` 0.1.6's torch backend computes (torch 2.13, CPU), as the kernel
gates saw it: Newton–Schulz in float16 whatever the input's dtype, so a tiny input underflows
to zero; and zero iterations crash on a matrix that is not square.

Run: ``python examples/findings/gram_newton_schulz_float16.py`` (only torch and
``gram-newton-schulz==0.1.6``, installed ``--no-deps``; prints what it measures, exits 0).

``GramNewtonSchulz(ns_use_kernels=False, compile_kwargs=None)`` with Keller Jordan's quintic on
every iteration, against five iterations written here in torch alone in float32
(``X / (‖X‖ + 1e-7)``, then ``X ← a·X + (b·A + c·A²)·X``, ``A = X Xᵀ``, on the wide side).

1. A float32 ``[24, 16]`` input: every output value is a float16 value (cast to float16 and
   back, it is unchanged), and it is 2.3e-3 (relative Frobenius) from float32 iteration.
   By design: it normalizes in float32, then iterates in float16.
2. The same input times 1e-30: float32 iteration gives a tiny nonzero result; it gives all
   zeros, as 1e-30 / 1e-7 underflows in float16. A consequence of (1).
3. ``ns_coefficients=[]`` (zero iterations): a square matrix comes back normalized, a
   ``[4, 6]`` one raises ``TypeError`` (its Gram path multiplies by a ``Q`` it never set).
   A limit of the package: an empty schedule is accepted, then fails on some shapes only.
"""

import torch
from gram_newton_schulz import GramNewtonSchulz

KELLER = [3.4445, -4.7750, 2.0315]


def float32_newton_schulz(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    x = g.mT if g.size(-2) > g.size(-1) else g
    x = x / (x.norm() + 1e-7)
    a, b, c = KELLER
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if g.size(-2) > g.size(-1) else x


def main() -> None:
    torch.manual_seed(0)
    g = torch.randn(24, 16)
    ns = GramNewtonSchulz(ns_use_kernels=False, ns_coefficients=[KELLER] * 5, compile_kwargs=None)
    out, want = ns(g), float32_newton_schulz(g)
    print(f"float32 input: output dtype {out.dtype}, every value a float16 value: "
          f"{bool(torch.equal(out.half().float(), out))}", flush=True)  # fmt: skip
    print(f"relative Frobenius error against float32 iteration: {((out - want).norm() / want.norm()).item():.3g}")
    tiny = g * 1e-30
    print(f"input times 1e-30: max|output| {ns(tiny).abs().max().item():.3g}, "
          f"float32 iteration {float32_newton_schulz(tiny).abs().max().item():.3g}")  # fmt: skip
    zero = GramNewtonSchulz(ns_use_kernels=False, ns_coefficients=[], compile_kwargs=None)
    print(f"zero iterations, [4, 4]: output norm {zero(torch.randn(4, 4)).norm().item():.3g}")
    try:
        zero(torch.randn(4, 6))
        print("zero iterations, [4, 6]: returned")
    except TypeError as e:
        print(f"zero iterations, [4, 6]: TypeError: {e}")


if __name__ == "__main__":
    main()
