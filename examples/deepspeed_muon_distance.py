"""How far DeepSpeed's Muon lands from ``reference.Muon``, correct and with the engine gates'
planted bugs: whether a tolerance tier against the reference could separate them.

    python examples/deepspeed_muon_distance.py [--cases 400] [--max-side 64]

Each case draws a matrix of random shape and two steps of gradients (the first the mean of two
ranks' gradients), and measures the relative Frobenius distance of the parameter's change after
two steps from reference.Muon's (EMA momentum 0.95 with Nesterov, Keller's quintic, bf16
Newton–Schulz, lr·√max(1, rows/cols)). DeepSpeed's ``muon_update`` runs eagerly, as the adapter
has it. The wrong variants: each half of the rows orthogonalized alone (``sliced``), half of the
elements from one rank's unreduced gradient (``partly reduced``), a step per micro-batch of half
the gradient (``per micro-batch``). A tier separates only if every correct distance lies below
every wrong one.

It measures the reference on its defaults, which is why no tier was found. The engine gate now
judges DeepSpeed against the reference on the settings that are DeepSpeed's arithmetic
(``examples.deepspeed_adapter.conventions``), bit for bit, and needs no tier
(``examples/deepspeed_reference_settings.py``).
"""

from __future__ import annotations

import argparse
import os
import random

import torch

os.environ.setdefault("DS_ACCELERATOR", "cpu")
torch._dynamo.config.disable = True

from deepspeed.runtime.zero.muon.original_muon import muon_update  # noqa: E402

import reference  # noqa: E402

LR, BETA = 0.02, 0.95


def reference_change(grads: list[torch.Tensor]) -> torch.Tensor:
    p = torch.nn.Parameter(torch.zeros_like(grads[0]))
    optimizer = reference.Muon([{"params": [p], "use_muon": True}], lr=LR, momentum=BETA, weight_decay=0.0)
    for g in grads:
        p.grad = g.clone()
        optimizer.step()
    return p.detach()


def deepspeed_change(grads: list[torch.Tensor], ns_method: str = "gram", sliced: bool = False) -> torch.Tensor:
    p, momentum = torch.zeros_like(grads[0]), torch.zeros_like(grads[0])
    rows = max(1, grads[0].shape[0] // 2)
    for g in grads:
        if sliced and rows < g.shape[0]:
            halves = [muon_update(g[s].clone(), momentum[s], beta=BETA, ns_method=ns_method)
                      for s in (slice(0, rows), slice(rows, None))]  # fmt: skip
            update = torch.cat(halves)
        else:
            update = muon_update(g.clone(), momentum, beta=BETA, ns_method=ns_method)
        p.add_(update.reshape(p.shape), alpha=-LR)
    return p


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=400)
    parser.add_argument("--max-side", type=int, default=64)
    parser.add_argument("--min-side", type=int, default=2)
    args = parser.parse_args()
    random.seed(0)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    found: dict[str, list[float]] = {
        k: []
        for k in ("correct (gram, fp16)", "correct (standard, bf16)", "sliced", "partly reduced", "per micro-batch")
    }
    for _ in range(args.cases):
        shape = (random.randint(args.min_side, args.max_side), random.randint(args.min_side, args.max_side))
        mine, theirs, later = torch.randn(shape), torch.randn(shape), torch.randn(shape)
        mean = (mine + theirs) / 2
        expected = reference_change([mean, later])
        partly = mean.flatten().clone()
        partly[partly.numel() // 2 :] = mine.flatten()[partly.numel() // 2 :]
        variants = {
            "correct (gram, fp16)": deepspeed_change([mean, later]),
            "correct (standard, bf16)": deepspeed_change([mean, later], ns_method="standard"),
            "sliced": deepspeed_change([mean, later], sliced=True),
            "partly reduced": deepspeed_change([partly.view(shape), later]),
            "per micro-batch": deepspeed_change([mine / 2, theirs / 2, later / 2, later / 2]),
        }
        for name, change in variants.items():
            found[name].append(float((change - expected).norm() / expected.norm()))
    for name, distances in found.items():
        distances.sort()
        print(
            f"{name:26s} min {distances[0]:.4f}  median {distances[len(distances) // 2]:.4f}  max {distances[-1]:.4f}"
        )


if __name__ == "__main__":
    main()
