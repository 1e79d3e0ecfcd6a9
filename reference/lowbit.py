"""Single-device AdamW with block-quantized moments, the reference for low-bit AdamWs.

Low-bit AdamWs (torchao's ``AdamW8bit``, bitsandbytes' ``AdamW8bit``) store each moment as
small integer codes, one float32 scale per block of consecutive elements: a code times its
block's scale is the moment's value. The update of a step is taken from the float32 moments
before they are stored back, so the rounding a code adds shows from the next step on.
Everything is elementwise *except the scale*: it is the largest magnitude in a block of the
**whole** tensor. Under FSDP2 a rank holds a piece whose first element need not start a
block, so a sharded low-bit AdamW that takes its blocks along its own piece computes other
scales, hence other moments, from the second step on. That is the bug this reference exists
to catch, with whether a tensor is quantized at all, which is decided by the whole tensor's
size, not by the piece's.

Conventions, beyond ``reference.AdamW``'s (its module docstring), each a setting:

``block_size``
    consecutive elements of the flattened whole tensor that share one scale; the last block
    may be shorter.
``min_quantized_numel``
    a tensor of fewer elements keeps float32 moments (torchao and bitsandbytes: 4096).
the codes
    linear and symmetric: ``code = round(x · levels / scale)``, ``value = code · (scale / levels)``,
    ``scale`` the block's largest magnitude (a block of zeros keeps zeros); ``levels`` is 127
    for the first moment (signed codes) and 255 for the second and its running maximum
    (unsigned). This is not torchao's or bitsandbytes' dynamic code map: the claim this
    reference serves is about where blocks lie, which a linear map shows as well.

The moments are kept as float32 tensors of the parameter's shape holding exactly the values
the codes stand for (``quantized``), so a candidate's state compares with them by name like
any AdamW's. The step count and every other convention are ``reference.AdamW``'s; the
moments' arithmetic runs in float32 whatever the parameter's dtype.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from reference.adamw import ADAMW_DEFAULTS, AdamW, adam_step, validate_adamw_settings

LOWBIT_DEFAULTS: dict[str, Any] = dict(ADAMW_DEFAULTS, state_dtype="float32", block_size=256, min_quantized_numel=4096)
#: the state that is stored as codes, and the code levels of each
QUANTIZED: dict[str, int] = {"exp_avg": 127, "exp_avg_sq": 255, "max_exp_avg_sq": 255}


def quantized(x: Tensor, *, block_size: int, levels: int) -> Tensor:
    """``x`` (float32) as its codes stand for it: blocks of ``block_size`` consecutive elements
    of the flattened tensor, each scaled by its largest magnitude and rounded to ``levels``
    steps either side of zero. Elementwise once the scales are known: a piece of the result is
    the piece of ``x`` with its blocks' scales."""
    flat = x.reshape(-1)
    pad = -flat.numel() % block_size
    blocks = torch.nn.functional.pad(flat, (0, pad)).view(-1, block_size)
    scale = blocks.abs().amax(dim=1, keepdim=True).expand(-1, block_size).reshape(-1)[: flat.numel()]
    return _coded(flat, scale, levels).view(x.shape)


def _coded(flat: Tensor, scale: Tensor, levels: int) -> Tensor:
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.where(scale > 0, torch.round(flat * levels / safe) * (safe / levels), torch.zeros_like(flat))


def validate_lowbit_settings(group: dict[str, Any]) -> None:
    """``reference.AdamW``'s checks, the block settings', and float32 moments (codes stand for float32 values)."""
    validate_adamw_settings(group)
    if not (isinstance(group["block_size"], int) and group["block_size"] >= 1):
        raise ValueError(f"block_size={group['block_size']!r} must be a whole number >= 1")
    if not (isinstance(group["min_quantized_numel"], int) and group["min_quantized_numel"] >= 0):
        raise ValueError(f"min_quantized_numel={group['min_quantized_numel']!r} must be a whole number >= 0")
    if group["state_dtype"] != "float32":
        raise ValueError(f"state_dtype={group['state_dtype']!r}: low-bit moments stand for float32 values")


def lowbit_adam_step(
    param: Tensor, grad: Tensor, state: dict[str, Any], *, block_size: int, min_quantized_numel: int, **adamw: Any
) -> None:
    """One AdamW step (``reference.adam_step``), its update from the float32 moments; then each
    moment stored as its codes stand for it, where the whole tensor has ``min_quantized_numel``
    elements or more."""
    adam_step(param, grad, state, **adamw)
    if param.numel() < min_quantized_numel:
        return
    for key, levels in QUANTIZED.items():
        if key in state:
            state[key].copy_(quantized(state[key], block_size=block_size, levels=levels))


class LowBitAdamW(AdamW):
    """AdamW whose moments are stored block-quantized (see the module docstring)."""

    SPACE: ClassVar[dict[str, tuple[Any, ...]]] = {
        **AdamW.SPACE,
        "block_size": (256, 2, 3, 4, 5, 8, 64),
        "min_quantized_numel": (4096, 0, 1, 16),
    }
    CONVENTIONS: ClassVar[dict[str, tuple[Any, ...]]] = {**AdamW.CONVENTIONS, "state_dtype": ("float32",)}
    #: a block's scale reads the whole block, across pieces
    ELEMENTWISE: ClassVar[bool] = False
    DEFAULTS: ClassVar[dict[str, Any]] = LOWBIT_DEFAULTS
    #: its moments are float32 whatever the parameter: torch's foreach kernels are not its form
    FORMS: ClassVar[dict[str, Any]] = {}
    #: no engine asks for it by name (its parent AdamW's name is AdamW's alone)
    ENGINE_NAME: ClassVar[str | None] = None
    STEP = lowbit_adam_step
    VALIDATE = validate_lowbit_settings
