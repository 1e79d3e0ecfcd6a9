"""Whether ``reference.Muon``, on the settings the DeepSpeed adapter declares as the installed
release's arithmetic (``examples.deepspeed_adapter.conventions``), steps as DeepSpeed's own
single-device ``SingleDeviceMuonWithAuxAdam`` does, bit for bit, on CPU::

    python -m examples.deepspeed_reference_settings
    PYTHONPATH=/tmp/ds-old python -m examples.deepspeed_reference_settings   # another release

For every ``ns_method`` the release takes and a few shapes (wide, tall, square, a row, a
column, 1×1), a matrix in a Muon group and a vector in an Adam group take three steps of drawn
gradients with weight decay; one line per shape says whether every parameter and state tensor
has the same bits, and how far the reference on its defaults lands (what the settings are
for). The Adam half is DeepSpeed's inline ``adam_update`` here (``adamw_form="keller"``),
which its engine runs up to 0.19.5; from 0.19.6 the engine hands it to ``torch.optim.AdamW``,
which the engine gates judge. The exit status is 1 if any shape differs.

The two sides share nothing but the gradients: the reference runs muongate's own Newton–Schulz
forms, DeepSpeed its ``muon_update`` (eager: the adapter turns ``torch.compile`` off).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

import reference
from examples.deepspeed_adapter import RELEASE, conventions, deepspeed_zero
from harness.engines import ATTRIBUTE, EngineConfig

SHAPES = ((7, 8), (8, 7), (5, 5), (3, 17), (17, 3), (1, 9), (9, 1), (24, 64), (64, 24), (1, 1))
SETTINGS = (("lr", 0.02), ("momentum", 0.95), ("weight_decay", 0.1))
STEPS = 3


def _deepspeed(matrix: nn.Parameter, vector: nn.Parameter, method: str | None) -> torch.optim.Optimizer:
    from deepspeed.runtime.zero.muon.original_muon import SingleDeviceMuonWithAuxAdam

    s = dict(SETTINGS)
    muon: dict[str, Any] = {"params": [matrix], "use_muon": True, **s}
    if method is not None:
        muon["ns_method"] = method
    adam = {"params": [vector], "use_muon": False, "lr": s["lr"], "weight_decay": s["weight_decay"]}
    return SingleDeviceMuonWithAuxAdam([muon, adam])


def _reference(matrix: nn.Parameter, vector: nn.Parameter, settings: dict[str, Any]) -> torch.optim.Optimizer:
    s = dict(SETTINGS)
    common: dict[str, Any] = {
        "lr": s["lr"],
        "weight_decay": s["weight_decay"],
        "adamw_lr": s["lr"],
        "adamw_weight_decay": s["weight_decay"],
    }
    groups = [{"params": [matrix]}, {"params": [vector], "use_muon": False}]
    return reference.Muon(groups, momentum=s["momentum"], **common, **settings)


def compare(shape: tuple[int, int], method: str | None) -> tuple[bool, float]:
    """Three steps on both sides: whether every tensor has the same bits, and the largest
    difference of the reference on its defaults (its DeepSpeed-independent arithmetic)."""
    options = SETTINGS + ((("ns_method", method),) if method is not None else ())
    # SingleDeviceMuonWithAuxAdam's Adam half is the inline one whatever the release: the keller form
    engine = conventions(EngineConfig("muon", 0, 1, None, "float32", options))
    settings = {**{k: v for k, v in engine.items() if k != "adamw_kernels"}, "adamw_form": "keller"}
    gen = torch.Generator().manual_seed(hash(shape) % 2**31)
    start = (torch.randn(shape, generator=gen), torch.randn((9,), generator=gen))
    sides = []
    for chosen in (None, settings, {"adamw_betas": (0.9, 0.95), "adamw_eps": 1e-10}):
        params = [nn.Parameter(t.clone()) for t in start]
        matrix, vector = params
        opt = _deepspeed(matrix, vector, method) if chosen is None else _reference(matrix, vector, chosen)
        sides.append((params, opt))
    for _ in range(STEPS):
        grads = (torch.randn(shape, generator=gen), torch.randn((9,), generator=gen))
        for params, opt in sides:
            for p, g in zip(params, grads, strict=True):
                p.grad = g.clone()
            opt.step()
    (ds, ds_opt), (ref, ref_opt), (plain, _) = sides
    same = all(torch.equal(a, b) for a, b in zip(ds, ref, strict=True))
    for a, b in zip(ds, ref, strict=True):
        theirs, ours = ds_opt.state[a], ref_opt.state[b]
        same &= all(
            torch.equal(theirs[k], ours[k]) for k in ("momentum_buffer", "exp_avg", "exp_avg_sq") if k in theirs
        )
    return same, float((ds[0] - plain[0]).detach().abs().max())


def main() -> int:
    declared = getattr(deepspeed_zero, ATTRIBUTE)
    methods = declared.options.get("muon", {}).get("ns_method", (None,))
    differ = 0
    for method in methods:
        for shape in SHAPES:
            same, off = compare(shape, method)
            differ += not same
            print(
                f"deepspeed {RELEASE} ns_method={method or '(none: standard)'} {list(shape)}: "
                f"{'bitwise' if same else 'DIFFERS'}; the reference on its defaults is {off:.3g} off"
            )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
