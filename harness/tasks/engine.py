"""An engine case on one rank: the engine trains the ``GradientFeed`` on this rank's
micro-batches, the one-device side steps on the mean gradient (exact, ``harness.engines.case``),
and after every step every rank compares every full parameter and every state tensor, as it
reads them through the engine's own API (the reads are collectives every rank makes in the same
order).

The one-device side is muongate's reference (``reference.Muon`` with its AdamW groups for
what is not a matrix, or ``reference.AdamW``), on the settings that express the engine's
arithmetic (``Engine.conventions``), or, where the engine declares ``judged="self"``, the
engine's own optimizer on one device. Where it declares ``shown``, its own optimizer steps
too, on copies of the same parameters, and its comparisons are shown beside the reference's
(``against="self"``) without deciding the verdict. A case that saves after a step continues
from a fresh engine, built on a model of other values, that loads the checkpoint.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

import reference
from harness.engines import EngineRun, LoadedEngine
from harness.engines.case import QUERY, EngineCase, GradientFeed
from harness.ranks import RankContext
from harness.tasks.common import param_groups
from harness.tasks.result import TaskResult
from harness.verdicts.compare import CLIP_NORM, compare
from reference.clipping import clip_coefficient, clip_gradients, grad_norm
from reports.records import Comparison


def reference_optimizer(
    named: list[tuple[str, nn.Parameter]],
    optimizer: str,
    settings: dict[str, Any],
    conventions: dict[str, Any] | None = None,
    heads: int = 1,
) -> torch.optim.Optimizer:
    """muongate's reference of an engine's ``optimizer`` on ``named``: ``reference.Muon`` (every
    matrix by Newton–Schulz, the rest by its AdamW at the same lr and decay) or ``reference.AdamW``,
    with ``conventions`` (``Engine.conventions``) over the case's settings. The engine's own
    options (``Engine.options``) are the engine's: they reach the reference through ``conventions`` only.
    ``heads`` > 1: the query projection (``QUERY``) in a group of its own, orthogonalized per head
    (``ns_heads``)."""
    if optimizer == "adamw":
        common = {k: settings[k] for k in ("lr", "weight_decay", "betas", "eps")}
        return reference.AdamW([p for _, p in named], **{**common, **(conventions or {})})
    groups = param_groups((n, p, p.ndim >= 2) for n, p in named if not (heads > 1 and n == QUERY))
    if heads > 1:
        query = dict(named)[QUERY]
        groups.insert(0, {"params": [query], "param_names": [QUERY], "use_muon": True, "ns_heads": heads})
    return reference.Muon(
        groups,
        **{
            "lr": settings["lr"],
            "weight_decay": settings["weight_decay"],
            "momentum": settings["momentum"],
            "adamw_lr": settings["lr"],
            "adamw_weight_decay": settings["weight_decay"],
            **(conventions or {}),
        },
    )


class _Side:
    """A one-device optimizer on float32 copies of the case's initial parameters, on the device the
    engine put them on (GPU arithmetic is judged against GPU arithmetic), and what its comparisons
    are marked as (``reference`` or ``self``)."""

    def __init__(self, initial: dict[str, Tensor], against: str) -> None:
        self.against = against
        self.params = {n: nn.Parameter(p.float().clone()) for n, p in initial.items()}
        self.optimizer: torch.optim.Optimizer

    def build(self, case: EngineCase, loaded: LoadedEngine) -> _Side:
        named = list(self.params.items())
        if self.against == "self":
            assert loaded.declared.single_device is not None
            self.optimizer = loaded.declared.single_device(named, case.config)
        else:
            self.optimizer = reference_optimizer(
                named, case.optimizer, dict(case.settings), dict(case.conventions), case.heads
            )
        return self


def run_engine_case(ctx: RankContext, case: EngineCase) -> TaskResult:
    loaded = LoadedEngine.load(case.engine)
    model = GradientFeed(case.shapes, case.seed, case.dtype, case.heads)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    run = loaded.factory(model, case.config, ctx.group)
    device = _device_of(run)
    initial = {n: p.to(device) for n, p in initial.items()}
    sides = [_Side(initial, case.against)]
    if case.shown and case.against == "reference":
        sides.append(_Side(initial, "self"))
    for side in sides:
        side.build(case, loaded)
    records: list[Comparison] = []
    first = 0
    if case.resumed_from is not None:
        path, world, first = case.resumed_from
        before = replace(case, world_size=world, resumed_from=None)
        for step in range(first):
            _one_step(sides, before.mean_gradient(step))
        run.load(path)
        records += _compare(ctx, run, sides, first - 1)
    for step in range(first, first + case.steps):
        for micro in range(case.accumulate):
            run.backward(run.module(case.feed(step, ctx.rank, micro)))
            run.step()
        gradients = case.mean_gradient(step)
        coefficient = None
        if case.clip:
            norm, judged = _clip_norm(ctx, run, case, step, gradients)
            records += judged
            coefficient = clip_coefficient(norm, case.clip, case.clip_form)
        _one_step(sides, gradients, coefficient)
        records += _compare(ctx, run, sides, step)
        if case.checkpoint_at == step:
            run = _reloaded(ctx, case, loaded, run)
    if case.save_to is not None:
        _save_resharded(ctx, loaded, run, case.save_to)
    return TaskResult(tuple(records), {})


def _device_of(run: EngineRun) -> torch.device:
    """Where the engine keeps the model it drives (its first parameter's device; the CPU for none)."""
    first = next(iter(run.module.parameters()), None)
    return torch.device("cpu") if first is None else first.device


def _clip_norm(
    ctx: RankContext, run: EngineRun, case: EngineCase, step: int, gradients: Mapping[str, Tensor]
) -> tuple[Tensor, list[Comparison]]:
    """The norm the engine clipped its step by (``grad_norm()``, a tensor in its own dtype), and on rank 0 its
    comparison with the float64 norm of the mean ``gradients`` (``CLIP_NORM``'s fp32 tier). An
    engine that declared the cell (``Engine.clip``) and reports no norm is refused by name: the
    one-device side cannot scale its gradients as the engine did without it."""
    expected = grad_norm(gradients.values()).to(torch.float32)
    reported = getattr(run, "grad_norm", lambda: None)()
    if reported is None:
        raise RuntimeError(
            f"{case.engine} at stage {case.stage} reports no clipping norm (grad_norm() gave None), "
            "which its Engine.clip declares it does; declare None for this config"
        )
    # in the dtype the engine found it in (DeepSpeed's stage 3 sums in float64), which its scale keeps
    norm = (
        reported.detach().reshape(()).cpu()
        if torch.is_tensor(reported)
        else torch.tensor(reported, dtype=torch.float64)
    )
    found = compare(expected, norm.float(), tensor="clip.total_norm", step=step, rank=0, tier=CLIP_NORM["float32"])
    return norm, [found] if ctx.rank == 0 else []


def _one_step(sides: list[_Side], gradients: Mapping[str, Tensor], coefficient: Tensor | None = None) -> None:
    """Each side steps on the step's mean ``gradients``, scaled by ``coefficient`` where the engine clipped."""
    for name, grad in gradients.items():
        for side in sides:
            side.params[name].grad = grad.to(side.params[name].device, copy=True)
    if coefficient is not None:
        for side in sides:
            clip_gradients([p.grad for p in side.params.values() if p.grad is not None], coefficient)
    for side in sides:
        side.optimizer.step()
        side.optimizer.zero_grad(set_to_none=True)


def _save_resharded(ctx: RankContext, loaded: LoadedEngine, run: EngineRun, where: str) -> None:
    """Saves into ``where/saved``; rank 0 converts it into ``where/resharded`` (``Engine.reshard``)."""
    run.save(str(Path(where, "saved")))
    if ctx.rank == 0:
        assert loaded.declared.reshard is not None
        loaded.declared.reshard(str(Path(where, "saved")), str(Path(where, "resharded")))
    dist.barrier(group=ctx.group)


def _compare(ctx: RankContext, run: EngineRun, sides: list[_Side], step: int) -> list[Comparison]:
    """Every full parameter and state tensor, as this rank reads it, against each one-device
    side's: on every rank, so that a replica that went its own way (an engine that keeps the
    state whole on every rank, each stepping its own) differs where it did."""
    records: list[Comparison] = []
    for name in sides[0].params:
        full = run.full_param(name)
        state = run.full_state(name)
        for side in sides:
            p = side.params[name]
            found = [compare(p.detach(), full, tensor=name, step=step, rank=ctx.rank)]
            expected = {k: v for k, v in side.optimizer.state.get(p, {}).items() if torch.is_tensor(v) and v.ndim > 0}
            for key in sorted(expected):
                if key in state:
                    found.append(compare(expected[key], state[key], tensor=f"{name}.{key}", step=step, rank=ctx.rank))
                else:
                    found.append(_missing(f"{name}.{key}", step, expected[key], ctx.rank))
            records += [replace(r, against=side.against) for r in found]
    return records


def _missing(tensor: str, step: int, expected: torch.Tensor, rank: int) -> Comparison:
    """A state tensor the one-device side keeps and the engine does not show."""
    found = compare(expected, expected.new_empty((0,)), tensor=tensor, step=step, rank=rank)
    return replace(found, note="the engine shows no such state (full_state did not return it)")


def _reloaded(ctx: RankContext, case: EngineCase, loaded: LoadedEngine, run: EngineRun) -> EngineRun:
    """Saves ``run`` and returns a fresh engine, on a model of other values, that loaded it."""
    where: list[Any] = [tempfile.mkdtemp(prefix="muongate-engine-") if ctx.rank == 0 else None]
    dist.broadcast_object_list(where, src=dist.get_global_rank(ctx.group, 0), group=ctx.group)
    try:
        run.save(where[0])
        fresh = loaded.factory(GradientFeed(case.shapes, case.seed + 1, case.dtype, case.heads), case.config, ctx.group)
        fresh.load(where[0])
        dist.barrier(group=ctx.group)
    finally:
        if ctx.rank == 0:
            shutil.rmtree(where[0], ignore_errors=True)
    return fresh
