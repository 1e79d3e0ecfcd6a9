"""Known-wrong training steps around a correct optimizer: the layout, not the optimizer, is
planted. Each declares one thing and does another, as the 2026 reports of mixed-precision
frameworks describe; the training gates must catch every one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from harness.models.precision import DTYPES
from harness.models.transformer import Transformer, TransformerCase


@dataclass(frozen=True)
class NarrowReduceTransformer(TransformerCase):
    """Declares its ``precision`` (bf16 parameters, float32 reduce) but lays the model out with
    FSDP2 reducing in the parameters' bf16: the gradients' sum is rounded to bf16 once more."""

    def shard(self, model: nn.Module, mesh: Any) -> None:
        assert isinstance(model, Transformer)
        dtype = DTYPES[self.precision.param or "float32"]
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
