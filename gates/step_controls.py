"""Known-wrong training steps around a correct optimizer: the layout, not the optimizer, is
planted. Each declares one step (``harness.models.step``) and lays the model out for another,
as the 2026 reports against training frameworks describe (a narrower reduce dtype than the
policy, a sum where a mean is due, a mean over the wrong group, a micro-batch dropped, a resume
that restarts the schedule, drops Adam's moments, forgets a decay mask or keeps the old world's
divisor, a pipeline that sums its micro-batches or trains on the last alone); the training
gates must catch every one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy

from harness.models.step import DTYPES
from harness.models.transformer import TransformerCase
from harness.tasks.pipeline import PipelineCase, feed, make_schedule


@dataclass(frozen=True)
class NarrowReduceTransformer(TransformerCase):
    """Declares its ``precision`` (bf16 parameters, float32 reduce) but lays the model out with
    FSDP2 reducing in the parameters' bf16: the gradients' sum is rounded to bf16 once more."""

    def shard(self, model: nn.Module, mesh: Any) -> None:
        dtype = DTYPES[self.precision.param or "float32"]
        self.wrap(model, mesh, MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype))


@dataclass(frozen=True)
class SummedReduceTransformer(TransformerCase):
    """Declares FSDP2's mean over the ranks but sums: a hook on every FSDP2 module multiplies the
    reduced gradient back by the world size (what a gradient divide factor of 1 does, which
    gloo cannot run as NCCL's pre-multiplied sum)."""

    def shard(self, model: nn.Module, mesh: Any) -> None:
        self.wrap(model, mesh, self.precision.policy())
        ranks = mesh.size()

        def summed(reduced: Tensor) -> None:
            reduced.mul_(ranks)

        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_all_reduce_hook(summed)


@dataclass(frozen=True)
class ShardGroupOnlyTransformer(TransformerCase):
    """Declares HSDP over every rank but lays FSDP2 out on the shard dimension alone: each
    replica steps on its own replica's mean, never all-reduced across them (a data-parallel
    wrapper over a group that leaves a dimension out)."""

    def shard(self, model: nn.Module, mesh: Any) -> None:
        self.wrap(model, mesh["shard"], self.precision.policy())


@dataclass(frozen=True)
class DroppedMicroBatchTransformer(TransformerCase):
    """Declares its micro-batches accumulated but clears the gradients before each one's forward
    (an optimizer's ``zero_grad`` inside the accumulation loop, not after the step): every
    micro-batch but the last is dropped, and the step is taken on one micro-batch's gradient."""

    def shard(self, model: nn.Module, mesh: Any) -> None:
        self.wrap(model, mesh, self.precision.policy())

        def cleared(module: nn.Module, args: Any) -> None:
            module.zero_grad(set_to_none=True)

        model.register_forward_pre_hook(cleared)


@dataclass(frozen=True)
class RestartedScheduleTransformer(TransformerCase):
    """Resumes its model and optimizer but not its learning-rate schedule, which starts again
    from its first step (a scheduler left out of the checkpoint)."""

    def restored(self, opt: torch.optim.Optimizer, schedule: Any, state: dict[str, Any]) -> None:
        pass


@dataclass(frozen=True)
class DroppedMomentTransformer(TransformerCase):
    """Resumes everything but AdamW's first moments, which start again from zero (a checkpoint
    conversion that loses a state tensor)."""

    def restored(self, opt: torch.optim.Optimizer, schedule: Any, state: dict[str, Any]) -> None:
        super().restored(opt, schedule, state)
        for held in opt.state.values():
            if "exp_avg" in held:
                held["exp_avg"].zero_()


@dataclass(frozen=True)
class DecayedOnResumeTransformer(TransformerCase):
    """Resumes everything, then sets every param group's weight decay to the optimizer's default
    (a framework that applies its config to the groups after a load, forgetting the mask): the
    norms and embeddings ``Resume.no_decay`` names take weight decay from then on."""

    def restored(self, opt: torch.optim.Optimizer, schedule: Any, state: dict[str, Any]) -> None:
        super().restored(opt, schedule, state)
        for group in opt.param_groups:
            for key in ("weight_decay", "adamw_weight_decay"):
                if key in opt.defaults:
                    group[key] = opt.defaults[key]


@dataclass(frozen=True)
class OldDivisorOnResumeTransformer(TransformerCase):
    """Resumed on fewer ranks, its FSDP2 still divides the summed gradients by the world it
    saved on (a divide factor carried over from the old job's config): every gradient after
    the resume is smaller by the new world over the old."""

    def shard(self, model: nn.Module, mesh: Any) -> None:
        super().shard(model, mesh)
        if mesh.size() < self.world_size:
            cast(FSDPModule, model).set_gradient_divide_factor(float(self.world_size))


@dataclass(frozen=True)
class SummedPipeline(PipelineCase):
    """Declares the mean over its micro-batches but runs the schedule with ``scale_grads=False``:
    the gradients are their sum, as where the loss is not divided by the micro-batches either."""

    def schedule_of(self, stages: list[Any], loss_fn: Any) -> Any:
        return make_schedule(self.schedule, stages, self.micro_batches, loss_fn, scale_grads=False)


@dataclass(frozen=True)
class LastMicroBatchPipeline(PipelineCase):
    """Declares its micro-batches' mean but steps the schedule once a micro-batch, zeroing the
    stage's gradients before each: only the last micro-batch trains (a ``zero_grad`` inside the
    micro-batch loop)."""

    def schedule_of(self, stages: list[Any], loss_fn: Any) -> Any:
        return make_schedule(self.schedule, stages, 1, loss_fn)

    def step(
        self, schedule: Any, stage_module: nn.Module, tokens: Tensor | None, targets: Tensor | None
    ) -> list[Tensor]:
        n = self.micro_batches
        inputs = [None] * n if tokens is None else tokens.tensor_split(n)
        outputs = [None] * n if targets is None else targets.tensor_split(n)
        losses: list[Tensor] = []
        for micro_tokens, micro_targets in zip(inputs, outputs, strict=True):
            stage_module.zero_grad()
            losses += feed(schedule, micro_tokens, micro_targets)
        return losses
