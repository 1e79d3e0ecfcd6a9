"""Known, understood differences from the reference ("causes"), and the tier each is judged in.

A candidate whose arithmetic differs from ``reference.Muon`` for a stated cause fails every
bitwise gate, and a real bug could hide in that failure. It declares its causes
(``Candidate.differences``), and the cause gate holds its one-step update to a tier
calibrated on exactly those causes, for the very setting of the case: Nesterov on or off,
the parameter's dtype, the Newton–Schulz dtype, and the shape family (square, wide, tall).

Calibration is measured on the gate's device when a setting is first asked for: on
``SAMPLES`` random matrices of the family, the relative Frobenius error of the update

* of a **correct variant**: the reference with the causes emulated, against the reference;
* of **wrong variants**, the causes emulated and a plausible bug added: one Newton–Schulz
  iteration fewer, or the lr scale taken from a shard of half the rows.

The bound is ``MARGIN`` (3) times the worst correct error: an update farther than that from
the reference's is an error the causes do not explain. It must lie below the best wrong
error; where it does not, the tier cannot judge that setting and says so (``NotSeparable``).
The cause gate runs at lr 1, so that a bf16 weight's own rounding is small beside its update.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

import reference
from harness.cases.case import optimizer_settings
from harness.compare import Tier

CAUSES: dict[str, str] = {
    "plain_quintic": "Newton–Schulz in the plain form B = b·A + c·(A@A); X = a·X + B@X, not addmm",
    "scaled_update": "the lr scale multiplies the orthogonalized update in its own dtype before the lr does",
    "bf16_momentum": "momentum kept in the parameter's dtype, so a bf16 parameter's update starts from bf16",
    "fp32_normalize": "the update normalized in float32 first, then cast to the Newton–Schulz dtype",
}
#: square; wide (fewer rows than columns); tall (at least twice the rows, where the lr scale
#: √(rows/cols) stays above one even on half the rows); and a little tall, in between
FAMILIES = ("square", "wide", "tall", "a little tall")
SAMPLES = 48
#: an update may be this many times as far from the reference's as the correct variants reach
MARGIN = 3.0
#: the least bound, where the causes change nothing at a setting (a float32 parameter's bf16 momentum)
FLOOR = 2.0**-20


class NotSeparable(ValueError):
    """The correct and wrong variants of a setting overlap: no tier can tell them apart."""


def family_of(shape: tuple[int, ...]) -> str:
    """The family (``FAMILIES``) of a matrix's shape."""
    rows, cols = shape[-2:]
    return "square" if rows == cols else "wide" if rows < cols else "tall" if rows >= 2 * cols else "a little tall"


def shape_in(family: str, small: int, large: int) -> tuple[int, int]:
    """A matrix of ``family`` from two sizes ``1 <= small <= large``."""
    if family == "square":
        return large, large
    if family == "wide":
        return small, large + 1
    if family == "tall":
        return 2 * large, small
    cols = max(2, small)
    return cols + 1 + large % (cols - 1), cols


def _newton_schulz(G: Tensor, group: dict[str, Any], causes: frozenset[str]) -> Tensor:
    """Newton–Schulz with the group's coefficients, eps form and dtype, and the causes that
    change it: the plain form (``plain_quintic``), the norm taken in float32 (``fp32_normalize``)."""
    schedule, safety = reference.coefficient_schedule(group["ns_coefficients"])
    normalize_first = "fp32_normalize" in causes
    X = G.to(torch.float32 if normalize_first else group["ns_dtype"], copy=True)
    tall = X.size(-2) > X.size(-1)
    if tall:
        X = X.mT
    norm = X.norm() * safety
    X = X / (norm + group["eps"]) if group["eps_form"] == "add" else X / norm.clamp(min=group["eps"])
    X = X.to(group["ns_dtype"])
    for i in range(group["ns_steps"]):
        a, b, c = schedule[min(i, len(schedule) - 1)]
        A = X @ X.mT
        if "plain_quintic" in causes:
            X = a * X + (b * A + c * (A @ A)) @ X
        else:
            X = torch.addmm(X, torch.addmm(A, A, A, beta=b, alpha=c), X, beta=a)
    return X.mT if tall else X


def one_step_update(
    p: Tensor, g: Tensor, group: dict[str, Any], causes: frozenset[str], *, steps_less: int = 0, rows_seen: int = 0
) -> Tensor:
    """The float32 change one Muon step from zero momentum (no weight decay) makes to ``p``,
    with ``causes`` emulated; ``steps_less`` and ``rows_seen`` plant the wrong variants' bugs."""
    momentum, nesterov = group["momentum"], group["nesterov"]
    if "bf16_momentum" in causes and p.dtype == torch.bfloat16:
        grad = g.to(p.dtype)
        buf = torch.zeros_like(grad)
        if group["momentum_form"] == "ema":
            buf.lerp_(grad, 1 - momentum)
            update = torch.lerp(grad, buf, momentum) if nesterov else buf
        else:
            buf.add_(grad)
            update = grad.add(buf, alpha=momentum) if nesterov else buf
    else:
        buf = torch.zeros_like(g, dtype=torch.float32)
        update = reference.momentum_update(buf, g, momentum, nesterov, group["momentum_form"])
    settings = {**group, "ns_steps": group["ns_steps"] - steps_less}
    changed = causes & {"plain_quintic", "fp32_normalize"}
    ortho = _newton_schulz(update, settings, changed) if changed else reference.group_orthogonalizer(settings)(update)
    rows, cols = p.shape
    scale = reference.lr_scale((rows_seen or rows, cols), group["adjust_lr_fn"])
    after = p.clone()
    if "scaled_update" in causes:
        reference.apply_update(after, ortho * scale, group["lr"], 0.0, group["lr"])
    else:
        reference.apply_update(after, ortho, group["lr"], 0.0, group["lr"] * scale)
    return after.float() - p.float()


def _shape(family: str, gen: torch.Generator) -> tuple[int, int]:
    small, large = sorted(int(x) for x in torch.randint(1, 33, (2,), generator=gen))  # as the gate draws them
    return shape_in(family, small, large)


def _rel_fro(actual: Tensor, expected: Tensor) -> float:
    return float((actual - expected).norm() / expected.norm().clamp(min=1e-30))


@functools.cache
def cause_tier(
    causes: frozenset[str], settings: tuple[tuple[str, Any], ...], dtype: str, family: str, device: str = "cpu"
) -> Tier:
    """The tier for ``causes`` at one setting (the group's ``settings``, the parameter's
    ``dtype``, the shape ``family``), measured now on ``device`` between correct and wrong variants."""
    unknown = sorted(causes - CAUSES.keys())
    if unknown:
        raise ValueError(f"unknown causes {unknown}; known: {sorted(CAUSES)}")
    group = {**reference.MUON_DEFAULTS, **optimizer_settings(settings)}
    gen = torch.Generator().manual_seed(0)
    correct, wrong = 0.0, math.inf
    wrongs: list[Callable[[Tensor, Tensor], Tensor]] = []
    if group["ns_steps"] >= 1:
        wrongs.append(lambda p, g: one_step_update(p, g, group, causes, steps_less=1))
    if family in ("tall", "a little tall"):  # only a tall matrix's lr scale depends on its rows
        wrongs.append(lambda p, g: one_step_update(p, g, group, causes, rows_seen=max(1, p.shape[0] // 2)))
    for _ in range(SAMPLES):
        shape = _shape(family, gen)
        p = torch.randn(shape, generator=gen).to(device, getattr(torch, dtype))
        g = torch.randn(shape, generator=gen).to(device)
        expected = one_step_update(p, g, group, frozenset())
        correct = max(correct, _rel_fro(one_step_update(p, g, group, causes), expected))
        for variant in wrongs:
            wrong = min(wrong, _rel_fro(variant(p, g), expected))
    ns = str(group["ns_dtype"]).removeprefix("torch.")
    setting = f"{'+'.join(sorted(causes))}, nesterov {group['nesterov']}, {dtype}, ns {ns}, {family}"
    bound = MARGIN * max(correct, FLOOR)
    if not bound < wrong:
        raise NotSeparable(
            f"{setting}: correct variants reach {correct:.3g} (bound {bound:.3g}), wrong ones {wrong:.3g}"
        )
    reason = f"{setting}: correct ≤ {correct:.3g}, wrong ≥ {wrong:.3g} ({SAMPLES} matrices each)"
    return Tier(f"cause:{'+'.join(sorted(causes))}", "tolerance", reason, max_rel_fro=bound)
