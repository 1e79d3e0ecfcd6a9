"""Single-device Adafactor, the reference for optimizers whose state is not shaped like the parameter.

Adafactor (Shazeer & Stern, 2018) keeps the second moment of a matrix *factored*: a row vector
of mean squared gradients over each row and a column vector over each column, whose outer
product, divided by their mean, stands in for the full moment. It is chosen here because that is
exactly what sharding splits awkwardly. Under FSDP2 each rank holds whole rows, so a row's mean
is local, but a column's mean needs every rank's rows, and so do the two whole-tensor norms the
step takes (the parameter's RMS for the step size, the update's RMS for clipping). A sharded
Adafactor that takes any of these on its own piece is wrong by more than rounding, and one that
reduces them across ranks sums in another order; its state (``row_var [..., rows, 1]``,
``col_var [..., 1, cols]``) is compared whole, not piece by piece.

The algorithm is ``torch.optim.Adafactor``'s (torch 2.5 and later), step for step, with its
keyword names:

relative step
    ``rho_t = min(lr, 1/√t)``; the step is ``alpha = max(eps2, RMS(p)) · rho_t``.
second-moment decay
    ``1 − β₂ₜ = t^beta2_decay`` (``beta2_decay`` ≤ 0; −0.8 by default).
factoring
    a parameter of 2 dimensions or more is factored over its last two; a vector keeps a full
    ``variance``. ``eps1`` (``None``: the dtype's machine epsilon) floors the row mean and, squared,
    the estimate.
clipping
    the update is divided by ``max(1, RMS(update)/d)``.
weight decay
    decoupled, before the update, with the relative step's lr: ``p ← p·(1 − lr·wd)``.
``maximize``
    the gradient's sign is flipped first.
``grad is None``
    the parameter is skipped: no decay, no state, no step count.

It has no momentum (torch's Adafactor has none). On one device it is ``torch.optim.Adafactor(
foreach=False)`` bit for bit (``tests/test_reference_adafactor.py``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from reference.adamw import PerParameter

ADAFACTOR_DEFAULTS: dict[str, Any] = dict(
    lr=1e-2, beta2_decay=-0.8, eps=(None, 1e-3), d=1.0, weight_decay=0.0, maximize=False
)


def validate_adafactor_settings(group: dict[str, Any]) -> None:
    """Raises ``ValueError`` naming the first setting of a param group that is out of range."""

    def bad(name: str, why: str) -> ValueError:
        return ValueError(f"{name}={group[name]!r} {why}")

    if not group["lr"] >= 0:
        raise bad("lr", "must be >= 0")
    if not group["beta2_decay"] <= 0:
        raise bad("beta2_decay", "must be <= 0")
    eps1, eps2 = group["eps"]
    if (eps1 is not None and not eps1 >= 0) or not eps2 >= 0:
        raise bad("eps", "must be (None or >= 0, >= 0)")
    if not group["d"] >= 1:
        raise bad("d", "must be >= 1")
    if not group["weight_decay"] >= 0:
        raise bad("weight_decay", "must be >= 0")
    if not isinstance(group["maximize"], bool):
        raise bad("maximize", "must be True or False")


def adafactor_step(
    param: Tensor,
    grad: Tensor,
    state: dict[str, Any],
    *,
    lr: float,
    beta2_decay: float,
    eps: tuple[float | None, float],
    d: float,
    weight_decay: float,
    maximize: bool,
) -> None:
    """One step of one parameter, its state created on the first call."""
    if "step" not in state:
        state["step"] = torch.tensor(0.0, dtype=torch.float32)
        if grad.dim() > 1:
            state["row_var"] = grad.new_zeros((*grad.shape[:-1], 1))
            state["col_var"] = grad.new_zeros((*grad.shape[:-2], 1, grad.shape[-1]))
        else:
            state["variance"] = torch.zeros_like(grad)
    g = -grad if maximize else grad
    eps1 = torch.finfo(param.dtype).eps if eps[0] is None else eps[0]
    step_t = state["step"]
    step_t += 1
    step = step_t.item()
    one_minus_beta2 = step**beta2_decay
    rho = min(lr, 1 / (step**0.5))
    alpha = max(eps[1], param.norm(2).item() / (param.numel() ** 0.5)) * rho
    if weight_decay != 0:
        param.mul_(1 - lr * weight_decay)
    if g.dim() > 1:
        row_mean = torch.norm(g, dim=-1, keepdim=True).square_().div_(g.size(-1))
        state["row_var"].lerp_(row_mean, one_minus_beta2)
        col_mean = torch.norm(g, dim=-2, keepdim=True).square_().div_(g.size(-2))
        state["col_var"].lerp_(col_mean, one_minus_beta2)
        estimate = state["row_var"] @ state["col_var"]
        estimate.div_(state["row_var"].mean(dim=-2, keepdim=True).clamp_(min=eps1))
    else:
        state["variance"].lerp_(g * g, one_minus_beta2)
        estimate = state["variance"].clone()
    update = estimate.clamp_(min=eps1 * eps1).rsqrt_()
    update.mul_(g)
    denom = max(1.0, update.norm(2).item() / ((update.numel() ** 0.5) * d))
    param.add_(update, alpha=-alpha / denom)


class Adafactor(PerParameter):
    """Adafactor on one device (see the module docstring); keyword names follow ``torch.optim.Adafactor``."""

    #: the settings the gates draw, each with its values, the default (the shrink target) first
    SPACE: ClassVar[dict[str, tuple[Any, ...]]] = {
        "lr": (1e-2, 0.1, 1e-3),
        "beta2_decay": (-0.8, -0.5, 0.0),
        "eps": ((None, 1e-3), (1e-30, 1e-3), (None, 0.0)),
        "d": (1.0, 2.0),
        "weight_decay": (0.0, 0.1),
        "maximize": (False, True),
    }
    #: no settings that are conventions: torch's Adafactor has one form of each
    CONVENTIONS: ClassVar[dict[str, tuple[Any, ...]]] = {}
    #: the parameters it takes, by number of dimensions (0 for a scalar)
    PARAM_NDIMS: ClassVar[tuple[int, ...]] = (0, 1, 2, 3)
    #: the state it keeps per parameter; each is compared with a candidate's state of that name
    STATE: ClassVar[tuple[str, ...]] = ("row_var", "col_var", "variance", "step")
    DEFAULTS: ClassVar[dict[str, Any]] = ADAFACTOR_DEFAULTS
    STEP = adafactor_step
    VALIDATE = validate_adafactor_settings
