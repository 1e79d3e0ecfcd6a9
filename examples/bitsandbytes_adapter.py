"""bitsandbytes 0.50's ``AdamW8bit`` as an ``--impl`` candidate, on FSDP2's DTensor parameters as
users hand them over (the optimizer built on ``model.parameters()`` after ``fully_shard``).

What the package does (``bitsandbytes/optim/optimizer.py``): a parameter of fewer than
``min_8bit_size`` (4096) elements keeps float32 states, a larger one 8-bit states quantized in
blocks of 256 (``absmax`` per block); the count is ``p.numel()``, a DTensor's *global* size. It
has no ``amsgrad`` (it raises) and no ``maximize``, so those are declared fixed; its decay is
decoupled. The claim is ``--against self`` (its arithmetic is not ``reference.AdamW``'s), and on
FSDP2 it does not get that far: its CPU kernels are not DTensor ops
(``examples/findings/bitsandbytes_dtensor_parameters.py``). Install: ``pip install --no-deps
bitsandbytes==0.50.2`` (``examples/peers-no-deps.txt``).
"""

from __future__ import annotations

from typing import Any

import torch

try:
    import bitsandbytes as bnb
except ImportError as e:
    raise ImportError(
        "examples.bitsandbytes_adapter needs the lowbit extra, without a torch of its own: "
        "pip install --no-deps bitsandbytes==0.50.2"
    ) from e

import reference
from harness.candidates import Candidate


@Candidate(
    reference=reference.AdamW,
    conventions={
        "weight_decay_form": "decoupled",
        "bias_correction": True,
        "eps_form": "outside",
        "state_dtype": "float32",
        "amsgrad": False,
        "maximize": False,
    },
    features={"bf16", "experts", "checkpoint"},
    layouts={"hsdp"},
    package="bitsandbytes",
    thresholds=(4096, 256),
)
def adamw_8bit(param_groups: list[dict[str, Any]], **settings: Any) -> torch.optim.Optimizer:
    keywords = ("lr", "betas", "eps", "weight_decay")
    return bnb.optim.AdamW8bit(param_groups, **{k: settings[k] for k in keywords})  # type: ignore[no-any-return]
