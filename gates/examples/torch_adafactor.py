"""``torch.optim.Adafactor`` as ``--impl`` candidates (``adafactor_for_loop``, ``adafactor_foreach``),
on FSDP2's DTensor parameters as users hand them over, judged against ``reference.Adafactor``.

Its step takes two whole-tensor norms (the parameter's RMS, the update's RMS) and a column mean
of the factored second moment; on DTensors those become reductions across ranks, in another
order than on one device. ``--impl gates.examples.torch_adafactor:adafactor_for_loop`` runs it
through every gate that holds for any algorithm.
"""

from __future__ import annotations

from typing import Any

import torch

import reference
from harness.candidates import Candidate

_KEYWORDS = tuple(reference.ADAFACTOR_DEFAULTS)


@Candidate(reference=reference.Adafactor, package="torch")
def adafactor_for_loop(param_groups: list[dict[str, Any]], **settings: Any) -> torch.optim.Optimizer:
    """``torch.optim.Adafactor(foreach=False)``: one parameter at a time."""
    return torch.optim.Adafactor(param_groups, foreach=False, **{k: settings[k] for k in _KEYWORDS})


@Candidate(reference=reference.Adafactor, package="torch")
def adafactor_foreach(param_groups: list[dict[str, Any]], **settings: Any) -> torch.optim.Optimizer:
    """``torch.optim.Adafactor(foreach=True)``."""
    return torch.optim.Adafactor(param_groups, foreach=True, **{k: settings[k] for k in _KEYWORDS})
