"""Known-wrong sharded AdamWs: each plants one bug that sharded Adam implementations have
shipped; the AdamW gates must catch every one (``test_adamw_gates.py``), or they prove nothing.

``PlantedAdamW`` is a correct sharded AdamW built from public parts only: the reference's own
elementwise step (``reference.adam_step``) on each DTensor parameter's local piece, its state
kept as plain tensors of that piece. Each control overrides one thing, so the bug is the only
difference; it takes the case's conventions like any candidate, so a control that computes
another one is a bug, not a convention.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from reference import ADAMW_DEFAULTS, AdamW, adam_step, init_adam_state


def _local(t: Tensor) -> Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class PlantedAdamW(AdamW):
    """AdamW on the local piece of each (DTensor) parameter: elementwise, so correct at any layout."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        for group in self.param_groups:
            settings = {k: group[k] for k in ADAMW_DEFAULTS}
            for p in group["params"]:
                if p.grad is not None:
                    self.update(p, cast(Tensor, p.grad), self.state[p], settings)
        return None

    def update(self, p: Tensor, grad: Tensor, state: dict[str, Any], settings: dict[str, Any]) -> None:
        """One parameter's step; the step a control may get wrong."""
        adam_step(_local(p), _local(grad), state, **settings)


class RankStepAdamW(PlantedAdamW):
    """Bias correction from one step count per rank, advanced once per ``step()`` in which this
    rank updated anything, as flat-buffer optimizers keep it, instead of each parameter's own
    count: a parameter that missed a gradient, or a rank whose pieces were all empty, counts wrong."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        self._rank_step = getattr(self, "_rank_step", 0)
        moved = False
        for group in self.param_groups:
            settings = {k: group[k] for k in ADAMW_DEFAULTS}
            for p in group["params"]:
                if p.grad is not None and _local(p).numel():
                    state = self.state[p]
                    if "step" not in state:
                        init_adam_state(
                            _local(p), state, amsgrad=settings["amsgrad"], state_dtype=settings["state_dtype"]
                        )
                    state["step"].fill_(self._rank_step)
                    adam_step(_local(p), _local(cast(Tensor, p.grad)), state, **settings)
                    moved = True
        self._rank_step += moved
        return None


class EpsInsideAdamW(PlantedAdamW):
    """Takes eps inside the square root (``√(v̂ + eps)``) while declaring torch's ``√v̂ + eps``."""

    def update(self, p: Tensor, grad: Tensor, state: dict[str, Any], settings: dict[str, Any]) -> None:
        super().update(p, grad, state, {**settings, "eps_form": "inside"})


class L2DecayAdamW(PlantedAdamW):
    """Adds the weight decay to the gradient (Adam's L2) while declaring AdamW's decoupled decay."""

    def update(self, p: Tensor, grad: Tensor, state: dict[str, Any], settings: dict[str, Any]) -> None:
        super().update(p, grad, state, {**settings, "weight_decay_form": "l2"})


ADAMW_CONTROLS: dict[str, type[PlantedAdamW]] = {
    cls.__name__: cls for cls in (RankStepAdamW, EpsInsideAdamW, L2DecayAdamW)
}
