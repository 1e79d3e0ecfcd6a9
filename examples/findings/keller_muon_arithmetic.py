"""Why Keller Jordan's ``muon-optimizer`` 0.1.0 is not single-device Muon bit for bit
(torch 2.13, CPU): its quintic is the plain form and its lr scale rounds the update first.

Run: ``python examples/findings/keller_muon_arithmetic.py`` (only torch and
``muon-optimizer==0.1.0``; prints what it measures, exits 0).

One ``SingleDeviceMuon`` step of a tall ``[8, 4]`` matrix against the same step written in
torch alone, two ways: with Newton–Schulz in ``addmm`` form and the lr scale folded into the
lr (``torch.optim.Muon``'s arithmetic and muongate's reference), and in Keller's own form
(``B = b·A + c·A@A; X = a·X + B@X``, then ``update *= √(rows/cols)`` in bf16). Seen: the
first differs, the second is bitwise. A convention of the package, declared by the adapter
(``plain_quintic``, ``scaled_update``) and judged in that cause tier, not a bug.
"""

import torch
from muon import SingleDeviceMuon

A, B, C = 3.4445, -4.7750, 2.0315


def step(p0: torch.Tensor, g: torch.Tensor, keller_form: bool) -> torch.Tensor:
    u = torch.lerp(g, torch.lerp(torch.zeros_like(g), g, 0.05), 0.95)  # EMA from zero, Nesterov
    x = u.bfloat16().mT  # tall: transposed
    x = x / (x.norm() + 1e-7)
    for _ in range(5):
        a = x @ x.mT
        x = (
            A * x + (B * a + C * a @ a) @ x
            if keller_form
            else torch.addmm(x, torch.addmm(a, a, a, beta=B, alpha=C), x, beta=A)
        )
    x = x.mT
    scale = max(1, g.size(-2) / g.size(-1)) ** 0.5
    if keller_form:
        x *= scale
        return p0.add(x, alpha=-0.02)
    return p0.add(x, alpha=-0.02 * scale)


def main() -> None:
    torch.manual_seed(0)
    p0, g = torch.randn(8, 4), torch.randn(8, 4)
    p = torch.nn.Parameter(p0.clone())
    p.grad = g.clone()
    SingleDeviceMuon([p]).step()
    for name, keller_form in (("the addmm form, lr scale in the lr", False), ("Keller's own form", True)):
        diff = (p.detach() - step(p0, g, keller_form)).abs().max().item()
        print(f"against {name}: max|diff| {diff:.3g}", flush=True)


if __name__ == "__main__":
    main()
