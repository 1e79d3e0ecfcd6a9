"""dtensor-muon 0.1.0's arithmetic is not single-device Muon's, in two stated ways (torch 2.11,
one H200; it needs triton and CUDA).

Run: ``python examples/findings/dtensor_muon_arithmetic.py`` (only torch, triton and
``dtensor-muon==0.1.0``; prints what it measures, exits 0).

1. Newton–Schulz: ``ns_loop_triton`` (the default) builds each Gram matrix with its own
   Triton kernel and runs the plain-form quintic, compiled. One step of a ``[4, 4]`` matrix
   (Keller's coefficients, sum momentum, Nesterov) is printed against the same step with
   the ``addmm`` form, the eager plain form, and the plain form as Inductor fuses it (each
   elementwise step in float32, rounded to bf16 once), written here in torch alone: at 5
   iterations and at 0, where only the normalization is left and the fused form is exact.
2. Weight decay is added to the orthogonalized update and scaled with it by
   ``lr · √max(1, rows/cols)``: on a tall ``[8, 2]`` matrix with ``wd`` 0.1 its step is
   printed against decoupled decay ``p · (1 − lr·wd)``.

Both are conventions of the package (its docstring's "zero communication" design and its
``u.add_(param, alpha=wd)``), not bugs: muongate's reference expresses neither, so its cells
fail bitwise; the first is judged in the ``fused_quintic`` cause tier.
"""

import torch
from dtensor_muon import Muon

A, B, C = 3.4445, -4.7750, 2.0315


def newton_schulz(g: torch.Tensor, form: str, steps: int) -> torch.Tensor:
    x = g.bfloat16()
    tall = x.size(0) > x.size(1)
    x = x.mT if tall else x
    x = (x.float() / (x.float().norm() + 1e-7)).bfloat16() if form == "fused" else x / (x.norm() + 1e-7)
    for _ in range(steps):
        a = x @ x.mT
        if form == "fused":
            x = (A * x.float() + ((B * a.float() + C * (a @ a).float()).bfloat16() @ x).float()).bfloat16()
        elif form == "plain":
            x = A * x + (B * a + C * (a @ a)) @ x
        else:
            x = torch.addmm(x, torch.addmm(a, a, a, beta=B, alpha=C), x, beta=A)
    return x.mT if tall else x


def one_step(p0: torch.Tensor, g: torch.Tensor, wd: float, steps: int = 5) -> torch.Tensor:
    p = torch.nn.Parameter(p0.clone())
    p.grad = g.clone()
    Muon([{"params": [p], "algorithm": "muon"}], lr=0.02, wd=wd, use_cautious_wd=False, ns_steps=steps,
         orthogonalization_strategy="newton_schulz").step()  # fmt: skip
    return p.detach()


def main() -> None:
    torch.manual_seed(0)
    p0, g = torch.randn(4, 4, device="cuda"), torch.randn(4, 4, device="cuda")
    u = g + 0.95 * g  # sum momentum from zero, Nesterov: g + μ·(μ·0 + g)
    for steps in (5, 0):
        theirs = one_step(p0, g, 0.0, steps)
        for name, form in (("addmm form", "addmm"), ("plain form, eager", "plain"), ("plain form, fused", "fused")):
            mine = p0 - 0.02 * newton_schulz(u, form, steps).float()
            print(f"[4, 4] step, {steps} iterations, against the {name}: "
                  f"max|diff| {(theirs - mine).abs().max().item():.3g}")  # fmt: skip
    p0, g = torch.randn(8, 2, device="cuda"), torch.randn(8, 2, device="cuda")
    decay = one_step(p0, g, 0.1) - one_step(p0, g, 0.0)
    print(f"[8, 2] change that wd 0.1 makes: {decay.norm().item():.4g}; "
          f"decoupled decay would make {(p0 * 0.02 * 0.1).norm().item():.4g} (ratio √(8/2) = 2)")  # fmt: skip


if __name__ == "__main__":
    main()
