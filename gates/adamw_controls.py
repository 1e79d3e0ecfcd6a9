"""Known-wrong sharded AdamWs: each plants one bug that sharded Adam implementations have
shipped; the AdamW gates must catch every one (``test_adamw_gates.py``), or they prove nothing.
The low-bit ones (``LOWBIT_CONTROLS``) are judged against ``reference.LowBitAdamW``.

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

from harness.tasks.common import local_of, local_piece
from reference import ADAMW_DEFAULTS, QUANTIZED, AdamW, LowBitAdamW, adam_step, init_adam_state, quantized


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
        adam_step(local_of(p), local_of(grad), state, **settings)


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
                if p.grad is not None and local_of(p).numel():
                    state = self.state[p]
                    if "step" not in state:
                        init_adam_state(
                            local_of(p), state, amsgrad=settings["amsgrad"], state_dtype=settings["state_dtype"]
                        )
                    state["step"].fill_(self._rank_step)
                    adam_step(local_of(p), local_of(cast(Tensor, p.grad)), state, **settings)
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


class PlantedLowBitAdamW(LowBitAdamW):
    """A correct sharded low-bit AdamW: ``reference.adam_step`` on each local piece, then each
    moment stored as its codes stand for it in the *whole* tensor's blocks (this rank's piece
    of ``reference.lowbit.quantized`` of the gathered moment), where the whole tensor is large
    enough. Each rank gathers every moment whether or not it stores the codes, so that a
    control deciding otherwise on some ranks still enters the same collectives."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        for group in self.param_groups:
            settings = {k: group[k] for k in ADAMW_DEFAULTS}
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                adam_step(local_of(p), local_of(cast(Tensor, p.grad)), state, **settings)
                for key, levels in QUANTIZED.items():
                    if key in state:
                        coded = self.codes(p, state[key], group["block_size"], levels)
                        if self.quantizes(p, group["min_quantized_numel"]):
                            state[key].copy_(coded)
        return None

    def quantizes(self, p: Tensor, least: int) -> bool:
        """Whether ``p``'s moments are stored as codes: by the whole tensor's size."""
        return p.numel() >= least

    def codes(self, p: Tensor, piece: Tensor, block_size: int, levels: int) -> Tensor:
        """This rank's piece of a moment as its codes stand for it, in the whole tensor's blocks."""
        whole = piece
        if isinstance(p, DTensor):
            whole = DTensor.from_local(
                piece, p.device_mesh, p.placements, shape=p.shape, stride=p.stride()
            ).full_tensor()
        return local_piece(quantized(whole, block_size=block_size, levels=levels), p)


class LocalBlockScaleAdamW(PlantedLowBitAdamW):
    """Takes its blocks along the local piece, so a block's scale is the largest magnitude of the
    piece's block, not of the whole tensor's: wrong wherever a piece does not start a block."""

    def codes(self, p: Tensor, piece: Tensor, block_size: int, levels: int) -> Tensor:
        return quantized(piece, block_size=block_size, levels=levels)


class LocalThresholdAdamW(PlantedLowBitAdamW):
    """Decides whether to store codes by the local piece's size, as torchao 0.18 does
    (``examples/findings/torchao_quantizes_per_shard.py``): a tensor quantized on one device
    keeps float32 moments on ranks whose piece is small."""

    def quantizes(self, p: Tensor, least: int) -> bool:
        return local_of(p).numel() >= least


LOWBIT_CONTROLS: dict[str, type[PlantedLowBitAdamW]] = {
    cls.__name__: cls for cls in (LocalBlockScaleAdamW, LocalThresholdAdamW)
}
