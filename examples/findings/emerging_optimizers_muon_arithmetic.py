"""Two things about NVIDIA ``emerging-optimizers`` 0.3.0's ``Muon`` (Python 3.12, torch 2.11;
seen on the H200 machine, run on CPU here).

Run: ``python examples/findings/emerging_optimizers_muon_arithmetic.py`` (only torch,
``emerging-optimizers==0.3.0`` and ``absl-py``; prints what it sees, exits 0).

1. It refuses ``num_ns_steps=0`` (``ValueError: num_ns_steps must be at least 1``), which
   single-device Muon takes (no orthogonalization). A limit of the package, by design.
2. With ``fp32_matmul_prec="medium"`` (its default) it normalizes the float32 update, then
   casts it to bf16 for Newton–Schulz; the reference (and ``torch.optim.Muon``) cast first
   and normalize in bf16. On a ``[2, 2]`` step (lr 1, no Nesterov, Keller's coefficients,
   ``shape_scaling``) it is printed against both orders, written here in torch alone:
   it matches the float32-first order and not the reference's. The adapter declares only
   ``scaled_update``, which does not explain this: a convention the adapter did not declare
   (the cause gate shows it, at ``w[2, 2] float32 · world 1``), not a bug.
3. It refuses a bf16 parameter at its first step: its momentum buffer takes the parameter's
   dtype, and its Newton–Schulz takes float32 only (``TypeError: Input tensor x must be in
   float32, got torch.bfloat16``). The matrix's probe of bf16, which its adapter does not
   declare, crashed on that message. A limit of the package, stated by name.
"""

import torch
from emerging_optimizers.orthogonalized_optimizers.muon import Muon

A, B, C = 3.4445, -4.7750, 2.0315


def ns(u: torch.Tensor, normalize_first: bool) -> torch.Tensor:
    if normalize_first:
        x = torch.nn.functional.normalize(u, p=2, dim=(-2, -1), eps=1e-7).bfloat16()
    else:
        x = u.bfloat16()
        x = x / x.norm().clamp(min=1e-7)
    for _ in range(5):
        a = x @ x.mT
        x = torch.addmm(x, torch.addmm(a, a, a, beta=B, alpha=C), x, beta=A)
    return x.float()


def main() -> None:
    try:
        Muon([torch.nn.Parameter(torch.zeros(2, 2))], num_ns_steps=0)
    except ValueError as e:
        print(f"1. num_ns_steps=0: ValueError: {e}", flush=True)
    torch.manual_seed(0)
    p0, g = torch.randn(2, 2), torch.randn(2, 2)
    p = torch.nn.Parameter(p0.clone())
    p.grad = g.clone()
    Muon([p], lr=1.0, weight_decay=0.0, nesterov=False, coefficient_type="simple", scale_mode="shape_scaling").step()
    u = g * 0.05  # EMA from zero, no Nesterov
    for name, first in (("normalized in float32, then bf16", True), ("bf16, then normalized (the reference)", False)):
        diff = (p.detach() - (p0 - ns(u, first))).abs().max().item()
        print(f"2. against Newton–Schulz {name}: max|diff| {diff:.3g}", flush=True)
    half = torch.nn.Parameter(p0.bfloat16())
    half.grad = g.bfloat16()
    try:
        Muon([half], lr=1.0).step()
        print("3. a bf16 parameter: stepped", flush=True)
    except TypeError as e:
        print(f"3. a bf16 parameter: TypeError: {e}", flush=True)


if __name__ == "__main__":
    main()
