"""torchao 0.18's low-bit AdamWs (``AdamW8bit``, ``AdamW4bit``, ``AdamWFp8``) as ``--impl``
candidates, on FSDP2's DTensor parameters as torchao's README hands them over (the optimizer
built on ``model.parameters()`` after ``fully_shard``).

What the package does that the gates must reach (``torchao/optim/adam.py``, ``_new_buffer``):
a state is quantized only if *the local shard* has at least 4096 elements and a multiple of the
block size (256 for 8-bit and fp8, 128 for 4-bit); blocks are taken along the flattened local
shard. So under FSDP2 "per tensor" is "per shard": the declared ``thresholds`` make the
generators draw tensors on both sides of 4096 elements, whole and per shard, at every world size.

Their arithmetic is not ``reference.AdamW``'s (the moments are updated as ``lerp`` in float32
and stored quantized): the claim is ``--against self``, sharded against the same optimizer on one
device (a one-rank FSDP2 mesh). Each step calls ``torch.compile(single_param_adam,
fullgraph=True)`` per parameter, tens of seconds a case on the CPU; here ``torch.compile`` is the
identity during ``step`` (disabling dynamo instead makes ``fullgraph=True`` raise), so the same
function runs eagerly, on both sides alike. Install: ``pip install --no-deps torchao==0.18.0`` (``examples/peers-no-deps.txt``).
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import torch

try:
    from torchao.optim import AdamW4bit, AdamW8bit, AdamWFp8
except ImportError as e:
    raise ImportError(
        "examples.torchao_adapter needs the lowbit extra, without a torch of its own: "
        "pip install --no-deps torchao==0.18.0"
    ) from e

import reference
from harness.candidates import Candidate

#: reference.AdamW's keywords torchao takes; it has no ``maximize``
_KEYWORDS = ("lr", "betas", "eps", "weight_decay", "amsgrad")
_DECLARED = Candidate(
    reference=reference.AdamW,
    conventions={
        "weight_decay_form": "decoupled",
        "bias_correction": True,
        "eps_form": "outside",
        "state_dtype": "float32",
        "maximize": False,
    },
    features={"bf16", "experts", "checkpoint"},
    layouts={"hsdp"},
    package="torchao",
    thresholds=(4096,),
)


def _eager(cls: type[torch.optim.Optimizer], groups: list[dict[str, Any]], settings: dict[str, Any]) -> Any:
    class Eager(cls):  # type: ignore[misc,valid-type]
        def step(self, closure: Any = None) -> Any:
            with mock.patch.object(torch, "compile", lambda fn, **_: fn):
                return super().step(closure)

    return Eager(groups, **{k: settings[k] for k in _KEYWORDS})


@_DECLARED
def adamw_8bit(param_groups: list[dict[str, Any]], **settings: Any) -> torch.optim.Optimizer:
    return _eager(AdamW8bit, param_groups, settings)  # type: ignore[no-any-return]


@_DECLARED
def adamw_4bit(param_groups: list[dict[str, Any]], **settings: Any) -> torch.optim.Optimizer:
    return _eager(AdamW4bit, param_groups, settings)  # type: ignore[no-any-return]


@_DECLARED
def adamw_fp8(param_groups: list[dict[str, Any]], **settings: Any) -> torch.optim.Optimizer:
    return _eager(AdamWFp8, param_groups, settings)  # type: ignore[no-any-return]
