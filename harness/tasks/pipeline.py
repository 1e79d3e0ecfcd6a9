"""Pipeline parallelism against one device: a transformer split into stages with
``torch.distributed.pipelining``, as users split one, each stage laid out by FSDP2 over its
data-parallel ranks, trained by the candidate on every stage.

A ``PipelineCase`` runs a ``TransformerCase`` on a ``(pp, dp)`` mesh: ``stages`` pipeline
ranks, each holding one model chunk (GPipe, 1F1B) or two (interleaved 1F1B, looped BFS: chunk
``r`` and ``stages + r``), each chunk a ``harness.models.transformer.Stage`` (the embedding
first, the head last) ``fully_shard``-ed over ``dp = world // stages`` ranks (one, where the
stages take every rank). Each step, each data-parallel rank's batch of ``micro_batches ×
batch`` windows goes through the schedule, which splits it into micro-batches, sums their
gradients (FSDP2 reduces only at the last backward) and divides by their number (pipelining's
``scale_grads``); the candidate then steps every chunk's parameters.

The one-device side (on every rank, the whole model) follows that declaration: each
data-parallel rank's micro-batches forward and backward in turn, each rank's gradients summed
over its micro-batches in the order the schedule's backwards take them, the mean over the
ranks (``harness.models.step.one_device_gradients`` with ``sync="last"``), then divided by the
number of micro-batches. Losses (on the last stage),
gradients, parameters and optimizer state of each stage's parameters are compared after every
step: bitwise where each mean has at most two ranks, else in ``reduction_order``. A schedule
that trains on only some micro-batches, or sums where a mean is due, differs; with three
micro-batches a wrong divisor is not a power of two away (``gates.step_controls``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from harness.algorithms import reference_of
from harness.models.corpus import byte_loss, windows
from harness.models.step import FULL, ONE, THROUGH, Accumulation, one_device_gradients
from harness.models.transformer import Stage
from harness.ranks import RankContext
from harness.tasks.common import compare_params_and_state, compare_shard, mesh_for
from harness.tasks.result import TaskResult
from harness.tasks.routing import routes_of
from harness.tasks.training import (
    AroundSpec,
    candidate_optimizer,
    order_free,
    reduction_order,
    reduction_order_loss,
    reference_optimizer,
    spec_groups,
)
from harness.verdicts.compare import BITWISE, compare
from reports.records import Comparison


class Schedule(NamedTuple):
    """A pipelining schedule as a case runs it: torch's class, the model chunks it gives each
    rank (2: stage ``r`` and ``stages + r`` on rank ``r``, torch's looped placement), and whether
    its backwards take a step's micro-batches last to first (their gradients add up in that order)."""

    cls: str
    chunks: int = 1
    reversed: bool = False


#: the schedules a case may run. Not ``ScheduleInterleavedZeroBubble``: with FSDP2 on each block
#: as well as on the stage (as ``TransformerCase.wrap`` lays a model out) its weight gradients
#: differ from one device's or are missing, a torch finding with a standalone reproducer
#: (``examples/findings/pipelining_zero_bubble_fsdp2_blocks.py``)
SCHEDULES = {
    "gpipe": Schedule("ScheduleGPipe"),
    "1f1b": Schedule("Schedule1F1B"),
    "interleaved_1f1b": Schedule("ScheduleInterleaved1F1B", chunks=2),
    "looped_bfs": Schedule("ScheduleLoopedBFS", chunks=2, reversed=True),
}


@dataclass(frozen=True)
class PipelineCase(AroundSpec):
    """A transformer (``spec``, a ``TransformerCase`` of ``spec.world_size`` ranks) trained over
    ``stages`` pipeline ranks (each holding the schedule's ``chunks`` of the model) by
    ``schedule`` (a key of ``SCHEDULES``) over ``micro_batches`` micro-batches of ``spec.batch``
    windows a step (module docstring)."""

    schedule: str = "gpipe"
    micro_batches: int = 3
    stages: int = 2

    def __post_init__(self) -> None:
        spec = self.spec
        if self.schedule not in SCHEDULES:
            raise ValueError(f"PipelineCase schedule={self.schedule!r}: one of {sorted(SCHEDULES)}")
        if self.stages < 2 or spec.world_size % self.stages or spec.layers % (self.stages * self.chunks):
            raise ValueError(
                f"PipelineCase stages={self.stages}: at least 2, dividing world_size={spec.world_size}, and with "
                f"{self.schedule}'s {self.chunks} chunk(s) a rank dividing the model's {spec.layers} layers"
            )
        if self.micro_batches < self.stages:
            raise ValueError(
                f"PipelineCase micro_batches={self.micro_batches}: at least one a stage ({self.stages}), as 1F1B needs"
            )
        declared = {"precision": FULL, "accumulation": ONE, "resume": THROUGH, "replicate": 1}
        for name, default in declared.items():
            if getattr(spec, name) != default:
                raise ValueError(
                    f"PipelineCase: the spec's {name}={getattr(spec, name)!r} is not run under a pipeline "
                    f"(its micro-batches are the pipeline's, in float32); declare {default!r}"
                )

    @property
    def data_parallel(self) -> int:
        """The ranks each stage is sharded over."""
        return self.world_size // self.stages

    @property
    def chunks(self) -> int:
        """Model chunks a pipeline rank holds."""
        return SCHEDULES[self.schedule].chunks

    def describe(self) -> str:
        held = f" ({self.chunks} chunks a rank)" if self.chunks > 1 else ""
        return (
            f"{self.spec.describe()} · pipeline {SCHEDULES[self.schedule].cls}, {self.stages} stages{held} × FSDP2 over "
            f"{self.data_parallel} rank{'s' if self.data_parallel > 1 else ''}, {self.micro_batches} micro-batches a step"
        )

    def one_device(self) -> Any:
        """What the one-device side follows: the spec on the data-parallel ranks, a step's
        micro-batches summed on each before the mean over them (FSDP2's reduction at the last
        backward); the division by their number follows."""
        return replace(self.spec, world_size=self.data_parallel, accumulation=Accumulation(self.micro_batches, "last"))

    # -- what a planted pipeline changes (gates.step_controls) --
    def schedule_of(self, stages: list[Any], loss_fn: Callable[[Tensor, Tensor], Tensor]) -> Any:
        """The schedule each step runs on this rank's ``stages``: ``schedule`` over
        ``micro_batches``, dividing the summed gradients by their number."""
        return make_schedule(self.schedule, stages, self.micro_batches, loss_fn)

    def step(
        self, schedule: Any, stage_module: nn.Module, tokens: Tensor | None, targets: Tensor | None
    ) -> list[Tensor]:
        """One step's forwards and backwards through the pipeline: ``tokens`` on the first stage,
        ``targets`` on the last (``None`` elsewhere); the last stage's micro-batch losses."""
        return feed(schedule, tokens, targets)


def make_schedule(
    name: str,
    stages: list[Any],
    micro_batches: int,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    *,
    scale_grads: bool = True,
) -> Any:
    """``torch.distributed.pipelining``'s schedule ``name`` (a key of ``SCHEDULES``) of a rank's
    ``stages`` (one, or a chunk each for a schedule of several)."""
    from torch.distributed import pipelining

    schedule = SCHEDULES[name]
    held = stages if schedule.chunks > 1 else stages[0]
    return getattr(pipelining, schedule.cls)(held, micro_batches, loss_fn=loss_fn, scale_grads=scale_grads)


def feed(schedule: Any, tokens: Tensor | None, targets: Tensor | None) -> list[Tensor]:
    """``schedule.step`` as a stage takes it: the first stage the inputs, the last the targets."""
    losses: list[Tensor] = []
    kwargs: dict[str, Any] = {} if targets is None else {"target": targets, "losses": losses}
    schedule.step(*(() if tokens is None else (tokens,)), **kwargs)
    return losses


def run_pipeline_case(ctx: RankContext, case: PipelineCase) -> TaskResult:
    """Trains both sides ``spec.steps`` steps (module docstring); this rank's stage's comparisons."""
    from torch.distributed.pipelining import PipelineStage

    spec, n = case.spec, case.micro_batches
    device = torch.device(ctx.device)
    ref_model = spec.build().to(device)
    model = copy.deepcopy(ref_model)
    pp_group, dp_mesh, index, dp_rank = _stage_of(ctx, case)
    total = case.stages * case.chunks
    chunks = [Stage(model, c * case.stages + index, total) for c in range(case.chunks)]
    for chunk in chunks:
        spec.shard(chunk, dp_mesh)
    stages = [
        PipelineStage(chunk, c * case.stages + index, total, device, group=pp_group) for c, chunk in enumerate(chunks)
    ]
    schedule = case.schedule_of(stages, byte_loss)
    stage_module = Held(chunks)
    opt = candidate_optimizer(spec, stage_module)
    ref_opt = reference_optimizer(spec, ref_model)
    one_device = case.one_device()
    tier = BITWISE if order_free(one_device) else reduction_order(one_device)
    loss_tier = BITWISE if order_free(one_device) else reduction_order_loss(one_device)
    first, last = index == 0, index == case.stages - 1  # stage 0's rank, and the last stage's
    names = dict(stage_module.named_parameters())
    ref_names = dict(ref_model.named_parameters())
    records: list[Comparison] = []
    for step in range(spec.steps):
        ref_losses = _one_device_step(ref_model, case, step, device)
        batch = windows(spec.seed, dp_rank, step, spec.batch * n, spec.seq, device)
        losses = case.step(schedule, stage_module, batch[:, :-1] if first else None, batch[:, 1:] if last else None)
        for micro, loss in enumerate(losses):
            expected = ref_losses[dp_rank][micro]
            records.append(
                compare(
                    expected, loss.detach(), tensor=f"loss[micro {micro}]", step=step, rank=ctx.rank, tier=loss_tier
                )
            )
        for name, p in names.items():
            ref_grad = ref_names[name].grad
            if p.grad is not None and ref_grad is not None:
                records.append(compare_shard(f"{name}.grad", step, ctx.rank, ref_grad, p.grad, tier))
        ref_opt.step()
        ref_opt.zero_grad()
        opt.step()
        opt.zero_grad()
        pairs = ((name, ref_names[name], p) for name, p in names.items())
        records += compare_params_and_state(
            pairs, ref_opt, opt, step=step, rank=ctx.rank, keys=reference_of(spec).state, tier=tier
        )
    declared = (
        (name, names[name], group.get("use_muon", True))
        for group in spec_groups(spec, stage_module)
        for name in group["param_names"]
        if ref_opt.state.get(ref_names[name])
    )
    return TaskResult(tuple(records), routes=routes_of(reference_of(spec), declared, opt, ctx.rank))


class Held(nn.Module):
    """The model chunks a pipeline rank holds, as one module whose parameters keep their names in
    the whole model (``Stage``'s), for the optimizer's groups and ``zero_grad``."""

    def __init__(self, chunks: list[Stage]) -> None:
        super().__init__()
        self.chunks = nn.ModuleList(chunks)

    def named_parameters(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        for chunk in self.chunks:
            yield from chunk.named_parameters()


def _stage_of(ctx: RankContext, case: PipelineCase) -> tuple[Any, Any, int, int]:
    """This rank's pipeline group, its stage's data-parallel mesh, its stage and its data rank,
    on a row-major ``(pp, dp)`` mesh: ranks ``s·dp .. s·dp + dp − 1`` hold stage ``s``."""
    from torch.distributed.device_mesh import DeviceMesh

    dp = case.data_parallel
    if dp == 1:
        mesh = DeviceMesh.from_group(ctx.solo_group, torch.device(ctx.device).type, mesh_dim_names=("dp",))
        return ctx.group, mesh, ctx.rank, 0
    grid = mesh_for(ctx, (case.stages, dp), names=("pp", "dp"))
    return grid.get_group("pp"), grid["dp"], grid.get_local_rank("pp"), grid.get_local_rank("dp")


def _one_device_step(model: nn.Module, case: PipelineCase, step: int, device: torch.device) -> list[list[Tensor]]:
    """Each data-parallel rank's micro-batch losses on the whole model; ``.grad`` becomes their
    gradients summed over each rank's micro-batches, averaged over the ranks, divided by the
    number of micro-batches (``PipelineCase.one_device``)."""
    spec, n = case.spec, case.micro_batches
    params = list(model.parameters())
    grads: list[list[Any]] = []
    losses: list[list[Tensor]] = []
    for rank in range(case.data_parallel):
        batch = windows(spec.seed, rank, step, spec.batch * n, spec.seq, device)
        grads.append([])
        losses.append([])
        for tokens, targets in zip(batch[:, :-1].tensor_split(n), batch[:, 1:].tensor_split(n), strict=True):
            loss = byte_loss(model(tokens), targets)
            grads[rank].append(torch.autograd.grad(loss, params, allow_unused=True))
            losses[rank].append(loss.detach())
        if SCHEDULES[case.schedule].reversed:
            grads[rank].reverse()  # summed in the order the schedule's backwards take them
    for p, grad in zip(params, one_device_gradients(grads, params, case.one_device()), strict=True):
        p.grad = grad / n
    return losses
