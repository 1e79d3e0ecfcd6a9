"""Gradient-norm clipping on a rank, before each step of an optimizer case that has a ``Case.clip``.

The candidate's clip (``Candidate.clip``; without one, ``torch.nn.utils.clip_grad_norm_`` on
``model.parameters()``) runs on the laid-out model, whose gradients are DTensors with the
parameters' placements: sharded, TP-replicated, HSDP-replicated, expert-parallel, with empty
pieces where a layout leaves them. It is judged three ways, every rank on what it holds:

* ``clip.total_norm``: the norm it returned, against the float64 norm of the full gradients,
  each distinct parameter once (``reference.clipping.grad_norm``), both rounded to float32, in
  the tier of a summation order (``harness.verdicts.compare.CLIP_NORM``); the infinity norm, a maximum,
  bit for bit;
* ``NAME.grad``: each piece it scaled, bit for bit against the full gradient scaled by the
  coefficient of the norm *it* returned (``clip_coefficient``), so that a wrong scale is red
  wherever the norm was right, and a norm within its tier never reddens the gradients;
* the step: the reference steps on those scaled full gradients, so the optimizer gates that
  follow judge the clipped update bit for bit.

A tied parameter (``Clip.tied``) is the same ``nn.Parameter`` registered a second time under
another module, as a tied embedding and output head are; it is one tensor of the norm.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from harness.candidates.declaration import declaration_of
from harness.cases.case import Case
from harness.tasks.common import compare_shard
from harness.tasks.layouts import case_param
from harness.verdicts.compare import BITWISE, Tier, clip_norm_tier, compare
from reference.clipping import clip_coefficient, clip_gradients, grad_norm
from reports.records import Comparison

#: the module a tied parameter is registered under a second time
TIED = "tied"


def torch_clip(model: nn.Module, max_norm: float, norm_type: float) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_`` on ``model.parameters()``, as a training loop calls it."""
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type)


def clip_of(candidate: Any) -> Callable[..., Any]:
    """The clipping a case judges: its candidate's declared ``clip``, else ``torch_clip``."""
    return declaration_of(candidate).clip or torch_clip


def tie(case: Case, model: nn.Module) -> None:
    """Registers the case's tied parameter (``Clip.tied``) a second time, as ``tied.weight``."""
    if case.clip is None or case.clip.tied is None:
        return
    alias = nn.Module()
    alias.register_parameter("weight", cast(nn.Parameter, case_param(model, case.clip.tied)))
    model.add_module(TIED, alias)


def norm_tier(case: Case) -> Tier:
    """The tier the returned norm is judged in: bit for bit for the infinity norm; else by the
    lowest-precision gradient dtype of the case and its largest tensor (``clip_norm_tier``)."""
    assert case.clip is not None
    if math.isinf(case.clip.norm_type):
        return BITWISE
    dtype = "bfloat16" if any(p.dtype == "bfloat16" for p in case.params) else "float32"
    return clip_norm_tier(dtype, max(math.prod(p.shape) for p in case.params))


def _returned(norm: Any) -> Tensor:
    """What a clip returned, as a 0-d tensor on the CPU: a DTensor read whole, a number as float32."""
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    if not isinstance(norm, Tensor):
        norm = torch.tensor(float(norm))
    return norm.detach().reshape(()).cpu()


def _copy(grad: Tensor | None) -> Tensor | None:
    return None if grad is None else grad.clone()


def clip_step(case: Case, step: int, rank: int, model: nn.Module, ref_params: Mapping[str, Tensor]) -> list[Comparison]:
    """Clips the candidate's gradients, judges the clip, and scales the reference's full
    gradients (``ref_params``' ``grad``, which this replaces) by the coefficient of the norm the
    candidate returned. Every rank runs it (the clip's collectives)."""
    clip = case.clip
    assert clip is not None
    # copies: a piece of a DTensor gradient may be a view of the full gradient the reference holds
    full = {s.name: _copy(ref_params[s.name].grad) for s in case.params}
    norm = _returned(clip_of(case.candidate)(model, clip.max_norm, clip.norm_type))
    # float32 on both sides, so that a difference reads in float32's ULPs (a maximum stays exact)
    expected = grad_norm(full.values(), clip.norm_type).to(torch.float32)
    records = [
        compare(expected, norm.to(torch.float32), tensor="clip.total_norm", step=step, rank=rank, tier=norm_tier(case))
    ]
    held = [g for g in full.values() if g is not None]
    clip_gradients(held, clip_coefficient(norm.to(held[0].device) if held else norm, clip.max_norm))
    for spec in case.params:
        g, p = full[spec.name], case_param(model, spec.name)
        ref_params[spec.name].grad = g
        if g is not None and p.grad is not None:
            records.append(compare_shard(f"{spec.name}.grad", step, rank, g, p.grad, like=p))
    return records
