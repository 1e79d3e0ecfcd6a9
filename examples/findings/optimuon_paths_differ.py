"""``optimuon`` 0.1.1's ``Muon`` on one device: its defaults (``foreach=True``, ``batched_ns=True``)
give other bits than the per-tensor loop its DDP path runs (``foreach=False, batched_ns=False``).

Run: ``python examples/findings/optimuon_paths_differ.py`` (one process, torch and the package;
exits 1 while the difference holds).

Two causes, each shown on its own: a bf16 matrix's foreach update rounds otherwise than the
loop's (1 ULP on a ``[4, 4]`` matrix after two steps here), and two float32 matrices of one
shape batched into one Newton–Schulz call (``gram_newton_schulz_batched``) come out otherwise
than one at a time. A convention of the package, not a bug: both are Muon, computed in another
order. It is why ``examples/optimuon_adapter.py`` compares the DDP path with the loop.
"""

import sys

import torch
from optimuon import Muon


def run(init: list[torch.Tensor], grads: list[list[torch.Tensor | None]], **kwargs: bool) -> list[torch.Tensor]:
    params = [torch.nn.Parameter(t.clone()) for t in init]
    opt = Muon(params, **kwargs)
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = None if g is None else g.clone()
        opt.step()
    return [p.detach() for p in params]


def main() -> int:
    gen = torch.Generator().manual_seed(1)
    differs = 0
    bf16 = [torch.randn(4, 4, generator=gen).bfloat16()]
    bf16_grads = [[torch.randn(4, 4, generator=gen).bfloat16()] for _ in range(2)]
    pair = [torch.randn(7, 5, generator=gen) for _ in range(2)]
    pair_grads = [[torch.randn(7, 5, generator=gen) for _ in range(2)] if s != 1 else [None, None] for s in range(3)]
    for name, init, grads, default in (
        ("bf16 [4, 4], foreach", bf16, bf16_grads, {"batched_ns": False}),
        ("two float32 [7, 5], batched Newton–Schulz", pair, pair_grads, {"foreach": False}),
    ):
        ours = run(init, grads, **default)
        loop = run(init, grads, foreach=False, batched_ns=False)
        diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(ours, loop, strict=True))
        same = all(torch.equal(a, b) for a, b in zip(ours, loop, strict=True))
        differs += not same
        print(f"{name}: default {'==' if same else '!='} loop, max|diff| {diff:.3g}")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
