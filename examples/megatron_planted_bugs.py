"""Engine bugs planted in Megatron-core (negative controls of the engine gate against the
reference): each is the Megatron adapter with one thing wrong after Megatron's own step, declared
as the adapter declares Megatron. The gate must fail each against ``reference.AdamW``
(``gates/test_engine_gates.py``)::

    pytest -m gate --nproc 2 --engine examples.megatron_adapter:megatron_ddp -k planted_megatron

``last_rank_state_lost``
    the last rank's Adam state zeroed after each optimizer step (a rank that restarts, or is
    re-partitioned, without its range of the state): the first step is right, the later ones
    are not, on that rank's range only.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from examples.megatron_adapter import MegatronRun, megatron_ddp
from harness.engines import ATTRIBUTE, Engine, EngineConfig

DECLARED: Engine = getattr(megatron_ddp, ATTRIBUTE)


class LastRankStateLost(MegatronRun):
    """Megatron, with the last rank's Adam state zeroed after every step of its optimizer."""

    def step(self) -> None:
        stepping = (self.micro + 1) % self.config.accumulate == 0
        super().step()
        if not stepping or dist.get_rank() != dist.get_world_size() - 1:
            return
        for optimizer in self.chained:
            for state in optimizer.optimizer.state.values():
                for key in ("exp_avg", "exp_avg_sq"):
                    if isinstance(state.get(key), torch.Tensor):
                        state[key].zero_()


@DECLARED
def last_rank_state_lost(model: nn.Module, config: EngineConfig, group: Any) -> MegatronRun:
    return LastRankStateLost(model, config, group)


#: the planted bugs, by name
CONTROLS = ("last_rank_state_lost",)
