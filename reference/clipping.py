"""Gradient-norm clipping on one device: the norm of the full gradients, and the scale it sets.

``grad_norm`` is the ``norm_type``-norm of every gradient of a model taken as one vector, each
*distinct* tensor once, however many names or modules it is reached by (a tied embedding and
output head is one tensor) and however many ranks hold a copy of it. It is computed in float64
from the exact values, so it is the true norm of float32 and bf16 gradients to within float64's
rounding: a candidate is judged by how far it lands from it, not by whether it summed in the
same order. The infinity norm is the largest ``|g|``, exact in any dtype.

``clip_coefficient`` is the factor ``torch.nn.utils.clip_grad_norm_`` scales every gradient by,
``min(max_norm / (total_norm + 1e-6), 1)``, computed from a given total norm in that norm's own
dtype and kept a 0-d tensor, as torch keeps it; ``clip_gradients`` scales tensors by it with the
same foreach kernel torch uses, so that the scaled gradient of a correct candidate is the same
bits as the full gradient scaled on one device, whatever norm the candidate arrived at.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

#: what ``torch.nn.utils.clip_grad_norm_`` adds to the norm before dividing
CLIP_EPS = 1e-6


def distinct(tensors: Iterable[Tensor | None]) -> list[Tensor]:
    """The tensors that are not ``None``, each object once, in first-seen order."""
    seen: set[int] = set()
    out = []
    for t in tensors:
        if t is not None and id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def grad_norm(grads: Iterable[Tensor | None], norm_type: float = 2.0) -> Tensor:
    """The ``norm_type``-norm of ``grads`` as one vector, each distinct tensor once (``None``
    skipped), as a float64 0-d tensor: ``(Σ |g|ᵖ)^(1/p)`` over every element, or ``max |g|``
    for ``p = inf``. No gradient at all is a norm of 0."""
    p = float(norm_type)
    if not (p > 0):
        raise ValueError(f"norm_type={norm_type!r}: a p-norm needs p > 0 (or inf)")
    values = [g.detach().to(torch.float64).abs().flatten() for g in distinct(grads)]
    if not values:
        return torch.zeros((), dtype=torch.float64)
    flat = torch.cat(values)
    if flat.numel() == 0:
        return torch.zeros((), dtype=torch.float64)
    if math.isinf(p):
        return flat.max()
    if p == 2.0:
        return flat.square().sum().sqrt()
    return flat.pow(p).sum().pow(1.0 / p)


#: how a clip turns the norm into the gradients' scale: torch's ``clip_grad_norm_`` multiplies by
#: ``min(max_norm / (norm + 1e-6), 1)``; DeepSpeed's ZeRO optimizers divide by
#: ``max((norm + 1e-6) / max_norm, 1)`` (``unscale_and_clip_grads``), which rounds otherwise
CLIP_FORMS = ("torch", "divide")


def clip_coefficient(total_norm: Tensor, max_norm: float, form: str = "torch") -> Tensor:
    """The factor the gradients are multiplied by, a 0-d tensor in ``total_norm``'s dtype:
    ``min(max_norm / (total_norm + 1e-6), 1)``, or ``1 / max((total_norm + 1e-6) / max_norm, 1)``
    for ``form="divide"`` (``CLIP_FORMS``)."""
    if form == "divide":
        return 1.0 / torch.clamp((total_norm + CLIP_EPS) / float(max_norm), min=1.0)
    if form != "torch":
        raise ValueError(f"form={form!r}: one of {CLIP_FORMS}")
    return torch.clamp(float(max_norm) / (total_norm + CLIP_EPS), max=1.0)


def clip_gradients(grads: Sequence[Tensor], coefficient: Tensor) -> None:
    """Scales each of ``grads`` in place by ``coefficient`` (a 0-d tensor), the foreach kernel
    ``clip_grad_norm_`` uses, on ``grads``' device."""
    if grads:
        torch._foreach_mul_(list(grads), coefficient.to(grads[0].device))
