"""``torch.optim.AdamW`` and ``torch.optim.Adam`` as ``--impl`` candidates, each implementation
(``for_loop``, ``foreach``, ``fused``) a factory of its own, on FSDP2's DTensor parameters as
users hand them over: ``torch.optim.AdamW(model.parameters(), ...)`` after ``fully_shard``.

Each declares ``reference.AdamW`` (``Candidate(reference=…)``) and the conventions of its class:
torch keeps the moments in the parameter's dtype, with bias correction and eps outside the
root; ``AdamW``'s decay is decoupled and ``Adam``'s is L2; the ``foreach`` factories run
torch's ``_foreach_*`` kernels (``reference.AdamW``'s form ``kernels="foreach"``). Each works
element by element on whatever DTensor it is handed, so each declares every layout. ``--impl
gates.examples.torch_adam:adamw_foreach`` puts one through every gate that holds for any
algorithm.

``adamw_for_loop`` is bitwise ``reference.AdamW`` in every generic gate but where torch's CPU
``lerp_`` gives a zero its sign by the element's place in its tensor, a finding about torch
(``examples/findings/torch_cpu_lerp_signed_zero.py``; ``docs/pages/references.md`` says where):
``beta1 = 0`` and a gradient of ``-0.0`` (``maximize=True`` on a zero gradient), where
``exp_avg.lerp_(grad, 1.0)`` is ``-0.0`` in the kernel's 16-element blocks and ``+0.0`` in the
remainder, so one device and a shard hold zeros of other signs. The reference runs the same
kernel: no value differs. The for-loop factories declare it, the cause ``signed_zero``
(``harness/verdicts/causes.py``), so that such a case is green within it, judged equal in value, and any
value that differs is red.
"""

from __future__ import annotations

from typing import Any

import torch

import reference
from harness.candidates import LAYOUTS, Candidate

#: reference.AdamW's keywords that are torch's own; the conventions are declared, not passed
_TORCH_KEYWORDS = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize")
_TORCH_CONVENTIONS = {"bias_correction": True, "eps_form": "outside", "state_dtype": "param"}


def _build(cls: Any, impl: dict[str, bool], groups: list[dict[str, Any]], settings: dict[str, Any]) -> Any:
    return cls(groups, **{k: settings[k] for k in _TORCH_KEYWORDS if k in settings}, **impl)


def adamw_for_loop(param_groups: list[dict[str, Any]], **settings: Any) -> torch.optim.Optimizer:
    """``torch.optim.AdamW(foreach=False)``: one parameter at a time."""
    return _build(torch.optim.AdamW, {"foreach": False}, param_groups, settings)


def adamw_foreach(param_groups: list[dict[str, Any]], **settings: Any) -> torch.optim.Optimizer:
    """``torch.optim.AdamW(foreach=True)``: the ``_foreach_*`` kernels over every parameter at once."""
    return _build(torch.optim.AdamW, {"foreach": True}, param_groups, settings)


def adamw_fused(param_groups: list[dict[str, Any]], **settings: Any) -> torch.optim.Optimizer:
    """``torch.optim.AdamW(fused=True)``: one fused kernel per parameter (CPU and CUDA)."""
    return _build(torch.optim.AdamW, {"fused": True}, param_groups, settings)


def adam_for_loop(param_groups: list[dict[str, Any]], **settings: Any) -> torch.optim.Optimizer:
    """``torch.optim.Adam(foreach=False)``: L2 weight decay."""
    return _build(torch.optim.Adam, {"foreach": False}, param_groups, settings)


def adam_foreach(param_groups: list[dict[str, Any]], **settings: Any) -> torch.optim.Optimizer:
    """``torch.optim.Adam(foreach=True)``."""
    return _build(torch.optim.Adam, {"foreach": True}, param_groups, settings)


def adam_fused(param_groups: list[dict[str, Any]], **settings: Any) -> torch.optim.Optimizer:
    """``torch.optim.Adam(fused=True)``."""
    return _build(torch.optim.Adam, {"fused": True}, param_groups, settings)


ADAMW = (adamw_for_loop, adamw_foreach, adamw_fused)
ADAM = (adam_for_loop, adam_foreach, adam_fused)
for _factory in (*ADAMW, *ADAM):
    Candidate(
        reference=reference.AdamW,
        conventions={
            **_TORCH_CONVENTIONS,
            "weight_decay_form": "decoupled" if _factory in ADAMW else "l2",
            **({"kernels": "foreach"} if _factory in (adamw_foreach, adam_foreach) else {}),
        },
        layouts=LAYOUTS,
        # measured on the for-loop and foreach kernels (the fused kernel is another order of arithmetic)
        differences={"signed_zero"} if _factory not in (adamw_fused, adam_fused) else (),
    )(_factory)
