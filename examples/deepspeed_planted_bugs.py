"""Engine bugs planted in DeepSpeed (negative controls of the engine gate against the reference):
each is the DeepSpeed adapter with one thing wrong after DeepSpeed's own step, declared as the
adapter declares DeepSpeed. The gate must fail each against ``reference.Muon``, whatever the
engine's own one-device optimizer says (``gates/test_engine_gates.py``)::

    pytest -m gate --nproc 2 --engine examples.deepspeed_adapter:deepspeed_zero -k planted_deepspeed

``momentum_restarted``
    every Muon momentum buffer zeroed after each optimizer step (a resumed or re-partitioned
    engine that loses its state): the first step is right, the later ones are not.
``bf16_communication``
    DeepSpeed configured with ``communication_data_type: bf16`` while its parameters and its
    declaration are float32: gradients reduced in a dtype narrower than declared. The exact feed
    passes it at stages 0 to 2 (its sums are exact in bf16); the precision witness fails it
    (``-k planted_deepspeed``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from examples.deepspeed_adapter import DeepSpeedRun, deepspeed_zero
from harness.engines import ATTRIBUTE, Engine, EngineConfig

DECLARED: Engine = getattr(deepspeed_zero, ATTRIBUTE)


class MomentumRestarted(DeepSpeedRun):
    """DeepSpeed, with Muon's momentum zeroed after every step of its optimizer."""

    def step(self) -> None:
        before = self.engine.global_steps
        super().step()
        if self.engine.global_steps == before:  # a micro-batch inside the accumulation
            return
        optimizer = self.engine.optimizer
        for states in (optimizer.state, getattr(getattr(optimizer, "optimizer", None), "state", {})):
            for state in states.values():
                buffer = state.get("momentum_buffer") if isinstance(state, dict) else None
                if isinstance(buffer, torch.Tensor):
                    buffer.zero_()


@DECLARED
def momentum_restarted(model: nn.Module, config: EngineConfig, group: Any) -> DeepSpeedRun:
    return MomentumRestarted(model, config, group)


class BF16Communication(DeepSpeedRun):
    """DeepSpeed told to communicate its gradients in bf16 (``communication_data_type``) while its
    parameters and declaration are float32: the reduction narrower than the declared dtype."""

    extra_config: ClassVar[dict[str, Any]] = {"communication_data_type": "bf16"}


@DECLARED
def bf16_communication(model: nn.Module, config: EngineConfig, group: Any) -> DeepSpeedRun:
    return BF16Communication(model, config, group)


#: the planted bugs, by name
CONTROLS = ("momentum_restarted",)
