"""Training-level claims: FSDP2 + a sharded optimizer trains a model exactly like one process.

Optimizer gates feed identical gradients; here both sides compute them. Every rank builds
the same model from the case's seed and keeps two copies: one under ``fully_shard`` with
the candidate optimizer, trained on this rank's micro-batch, and a single-process
reference (the spec's ``reference``: ``reference.Muon`` unless it names another), which runs every rank's micro-batch itself and steps on
the mean of their gradients, as FSDP2's reduce-scatter does. After every step the loss,
every gradient, every parameter and every optimizer state tensor is compared on this
rank's shard (no collective outside FSDP2 and the optimizer, so a wrong model cannot make
the comparison itself hang).

On 2 ranks FSDP2 averages two gradients, which is order-independent, so the verdict is
bitwise. Beyond 2 ranks FSDP2 sums in its own order; the tiers are ``reduction_order``
(tensors) and ``reduction_order_loss`` (losses), with the measured reasons.

A ``TrainingSpec`` says what to train: ``harness.models.moe.MoECase`` (the MoE deadlock
model) and ``harness.models.transformer.TransformerCase`` (a small decoder-only transformer
on text).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

import torch
from torch import Tensor, nn

from harness.algorithms import reference_of
from harness.cases.case import optimizer_settings
from harness.layouts import FSDP, FSDP_TP, Layout
from harness.models.step import THROUGH, accumulation_of, one_device_gradients, precision_of, replicas_of, resume_of
from harness.ranks import RankContext
from harness.ranks.switches import hold
from harness.tasks.checkpoint import checkpoint_dir, dcp_load, dcp_save, params_bytes, remove_checkpoint
from harness.tasks.common import (
    candidate_keywords,
    compare_params_and_state,
    compare_shard,
    factory_of,
    local_of,
    local_piece,
    mesh_for,
    param_groups,
)
from harness.tasks.result import TaskResult
from harness.tasks.routing import routes_of
from harness.verdicts.compare import BITWISE, Tier, compare
from reports.records import Comparison


class TrainingSpec(Protocol):
    """A model, how FSDP2 wraps it, and each rank's micro-batch loss; frozen and picklable."""

    @property
    def name(self) -> str: ...

    @property
    def world_size(self) -> int: ...

    @property
    def steps(self) -> int: ...

    @property
    def candidate(self) -> Any:
        """The candidate factory; ``None``: ``distributed_impl.ShardedMuon``."""
        ...

    @property
    def settings(self) -> tuple[tuple[str, Any], ...]: ...

    @property
    def reference(self) -> Any:
        """The reference class it trains against (``harness.algorithms.reference_of``)."""
        ...

    def build(self) -> nn.Module: ...

    def shard(self, model: nn.Module, mesh: Any) -> None: ...

    # and, for FSDP2 × TP twins, ``tp_plan() -> dict`` (``parallelize_module``'s plan)

    def loss(self, model: nn.Module, rank: int, step: int, device: torch.device) -> Tensor:
        """The loss of ``rank``'s micro-batch on ``step`` (sets any per-rank model state first)."""
        ...

    def evaluate(self, model: nn.Module, device: torch.device) -> float | None:
        """Held-out bits per byte (or ``None`` where it means nothing), on the reference."""
        ...

    def describe(self) -> str: ...


def _reduced(spec: TrainingSpec) -> str:
    """What the spec's gradients are computed and reduced in, as its tiers tell them apart: bf16
    gradients summed in float32, a bf16 sum, or float32 throughout (autocast included)."""
    precision = precision_of(spec)
    if precision.param == "bfloat16" and precision.reduce == "float32":
        return "bf16 grads, float32 reduce"
    return "bf16" if (precision.reduce or precision.param) == "bfloat16" else "float32"


def reduction_order(spec: TrainingSpec) -> Tier:
    """The tier of tensors beyond 2 ranks, where FSDP2 sums the per-rank gradients in its own
    order, by the dtype the spec declares its gradients are computed and reduced in."""
    reduced = _reduced(spec)
    n = spec.world_size
    if reduced == "bf16 grads, float32 reduce":
        return Tier(
            "reduction_order_bf16_grads_fp32_reduce",
            "tolerance",
            f"{n} ranks: bf16 gradients summed in float32, in FSDP2's order and the reference's; such a sum of up "
            "to 4 is exact, of 8 nearly: over 12 steps of the transformer bitwise at 4 CPU ranks and at most "
            "4.9e-9 relative at 8; bounded at 1e-6. A reduction in bf16 under this policy lands at 5e-3 or more "
            "at step 0 (4 and 8 ranks)",
            max_rel_fro=1e-6,
        )
    if reduced == "bf16":
        return Tier(
            "reduction_order_bf16",
            "tolerance",
            f"{n} ranks: gradients summed in bf16, in FSDP2's order and the reference's, round differently "
            "(5e-3 relative at step 0 at 4 CPU ranks, 1.2e-2 at 8); bf16 Newton-Schulz amplifies it: over 12 "
            "steps of the transformer at most 3.7% (gradients), 3.2% (parameters), 2.6% (state); bounded at 15%. "
            "It tells a wrong divisor or a lost rank, not a reduction rounded otherwise",
            max_rel_fro=0.15,
        )
    return Tier(
        "reduction_order",
        "tolerance",
        f"{n} ranks: FSDP2 sums per-rank gradients in its own order, the reference in rank "
        "order. Step-0 gradients differ in the last bits (measured ≤ 9e-8 relative), then bf16 Newton-Schulz, "
        "which is chaotic, amplifies them: on 4 CPU ranks over 12 steps of the transformer, parameters drifted "
        "to 2.9% relative Frobenius error, gradients 7%, optimizer state 2.6%; bounded at 15% (under bf16 "
        "autocast at 8 ranks: 2%, 0.84%, 0.72%)",
        max_rel_fro=0.15,
    )


def reduction_order_loss(spec: TrainingSpec) -> Tier:
    """Losses beyond 2 ranks: the drift of the parameters barely moves them, except in bf16."""
    reduced = _reduced(spec)
    if reduced == "bf16 grads, float32 reduce":
        return replace(reduction_order(spec), name="reduction_order_bf16_grads_fp32_reduce_loss")
    if reduced == "bf16":
        return Tier(
            "reduction_order_bf16_loss",
            "tolerance",
            f"{spec.world_size} ranks: bf16 losses of parameters that drifted as reduction_order_bf16 says: at "
            "most 1.3% relative over 12 steps at 4 and 8 CPU ranks; bounded at 5%",
            max_rel_fro=0.05,
        )
    return Tier(
        "reduction_order_loss",
        "tolerance",
        f"{spec.world_size} ranks: the parameters' drift (see reduction_order) moved the transformer's losses "
        "by at most 6e-5 relative over 12 steps on 4 CPU ranks (1.8e-4 under bf16 autocast at 8); bounded at 1e-3",
        max_rel_fro=1e-3,
    )


def model_groups(spec: TrainingSpec, model: nn.Module) -> list[dict[str, Any]]:
    """Muon for hidden matrices (2-D and 3-D), AdamW for vectors and the spec's ``adamw_modules``."""
    adamw: tuple[str, ...] = getattr(spec, "adamw_modules", ())

    def use_muon(name: str, p: Tensor) -> bool:
        return p.ndim >= 2 and not any(name == m or name.startswith(m + ".") for m in adamw)

    return param_groups((name, p, use_muon(name, p)) for name, p in model.named_parameters())


def spec_groups(spec: TrainingSpec, model: nn.Module) -> list[dict[str, Any]]:
    """The param groups of the spec's reference: a hybrid one's (Muon's) ``model_groups``, else
    one group of every parameter, by name; the parameters its ``Resume.no_decay`` names in
    groups of their own that decay nothing."""
    if reference_of(spec).hybrid:
        return resume_of(spec).masked(model_groups(spec, model))
    named = list(model.named_parameters())
    return resume_of(spec).masked([{"params": [p for _, p in named], "param_names": [n for n, _ in named]}])


def reference_optimizer(spec: TrainingSpec, model: nn.Module) -> torch.optim.Optimizer:
    """The spec's reference on ``model``'s parameters, with its settings."""
    factory = reference_of(spec).factory
    return hold(factory(spec_groups(spec, model), **optimizer_settings(spec.settings)))


def candidate_optimizer(spec: TrainingSpec, model: nn.Module) -> torch.optim.Optimizer:
    """The spec's candidate on ``model``'s parameters, with every setting of its reference, the
    defaults included (``candidate_keywords``), as the optimizer gates give it."""
    return factory_of(spec)(spec_groups(spec, model), **candidate_keywords(spec))


def order_free(spec: TrainingSpec) -> bool:
    """Whether every mean of the spec's reduction tree has at most two ranks (``harness.models.step``):
    a mean of two does not depend on the order a backend takes them in, so the step is bitwise."""
    replicas = replicas_of(spec)
    return replicas <= 2 and spec.world_size // replicas <= 2


def training_mesh(ctx: RankContext, spec: TrainingSpec) -> Any:
    """The spec's mesh: 1-D over its ranks, or HSDP's ``(replicate, shard)``."""
    replicas = replicas_of(spec)
    if replicas == 1:
        return mesh_for(ctx, (spec.world_size,))
    return mesh_for(ctx, (replicas, spec.world_size // replicas))


def run_training_case(ctx: RankContext, spec: TrainingSpec) -> TaskResult:
    """Trains both sides ``spec.steps`` steps; the comparisons, and the loss curve (the mean of
    the per-rank losses at each step, in bits per byte where the spec's loss is per byte)."""
    device = torch.device(ctx.device)
    ref_model = spec.build().to(device)
    model = copy.deepcopy(ref_model)
    ref_opt = reference_optimizer(spec, ref_model)
    mesh = training_mesh(ctx, spec)
    spec.shard(model, mesh)
    opt = candidate_optimizer(spec, model)
    resume = resume_of(spec)
    ref_schedule, schedule = resume.on(ref_opt), resume.on(opt)
    accumulation = accumulation_of(spec)
    bitwise = order_free(spec)
    tier = BITWISE if bitwise else reduction_order(spec)
    loss_tier = BITWISE if bitwise else reduction_order_loss(spec)
    records: list[Comparison] = []
    curve: list[float] = []
    held_out = [spec.evaluate(ref_model, device)]
    names = dict(model.named_parameters())
    stepping = spec  # the step's ranks and their data: after a resume on fewer ranks, theirs alone
    for step in range(spec.steps):
        ref_losses = _reference_step_grads(ref_model, stepping, step, device)
        curve.append(
            float(sum(sum(r) for r in ref_losses)) / stepping.world_size / accumulation.micro_batches / math.log(2)
        )
        for micro in range(accumulation.micro_batches):
            accumulation.before(model, micro)
            loss = forward_loss(spec, model, ctx.rank, _batch(spec, step, micro), device)
            accumulation.scaled(loss).backward()
            records.append(
                compare(
                    ref_losses[ctx.rank][micro], loss.detach(), tensor=_loss_name(spec, micro), step=step,
                    rank=ctx.rank, tier=loss_tier,
                )
            )  # fmt: skip
        for name, ref_p in ref_model.named_parameters():
            grad = names[name].grad
            if grad is not None and ref_p.grad is not None:
                records.append(compare_shard(f"{name}.grad", step, ctx.rank, ref_p.grad, grad, tier))
        ref_opt.step()
        ref_opt.zero_grad()
        opt.step()
        opt.zero_grad()
        for stepped in (ref_schedule, schedule):
            if stepped is not None:
                stepped.step()
        if step + 1 == resume.after:
            resumed = _resumed(ctx, spec, mesh, (model, opt, schedule), device)
            if resumed is None:  # a rank the resume left out: its part ends with the save
                return TaskResult(tuple(records))
            model, opt, schedule = resumed
            names = dict(model.named_parameters())
            if resume.world:
                stepping = replace(cast(Any, spec), world_size=resume.world, resume=replace(resume, world=0))
        pairs = ((name, ref_p, names[name]) for name, ref_p in ref_model.named_parameters())
        records += compare_params_and_state(
            pairs, ref_opt, opt, step=step, rank=ctx.rank, keys=reference_of(spec).state, tier=tier
        )
        if resume != THROUGH:
            records += _positions((ref_model, ref_opt), names, opt, step, ctx.rank)
    held_out.append(spec.evaluate(ref_model, device))
    ref_state = {name: ref_opt.state.get(p) for name, p in ref_model.named_parameters()}
    declared = (
        (name, names[name], group.get("use_muon", True))
        for group in spec_groups(spec, model)
        for name in group["param_names"]
        if ref_state[name]
    )
    routes = routes_of(reference_of(spec), declared, opt, ctx.rank)
    return TaskResult(tuple(records), {"train_bits": curve, "held_out_bits": held_out}, routes)


def _positions(
    ref: tuple[nn.Module, torch.optim.Optimizer],
    names: Mapping[str, Tensor],
    opt: torch.optim.Optimizer,
    step: int,
    rank: int,
) -> list[Comparison]:
    """Where a scheduled or resumed case stands: each param group's learning rate (the schedule's
    position; a group matched by its parameters' names, one the candidate does not hold so is not
    compared), its weight decay, and each parameter's step count, against the reference's."""
    ref_model, ref_opt = ref
    out: list[Comparison] = []
    held = {tuple(g.get("param_names", ())): g for g in opt.param_groups}
    for g in ref_opt.param_groups:
        mine = held.get(tuple(g["param_names"]))
        if mine is None:
            continue
        label = f"group of {g['param_names'][0]}"
        for key in ("lr", "weight_decay", "adamw_weight_decay"):
            if key in g and key in mine:
                expected, got = (torch.tensor(float(v), dtype=torch.float64) for v in (g[key], mine[key]))
                out.append(compare(expected, got, tensor=f"{key}[{label}]", step=step, rank=rank))
    for name, ref_p in ref_model.named_parameters():
        counts = (ref_opt.state.get(ref_p, {}).get("step"), opt.state.get(names[name], {}).get("step"))
        if None not in counts:
            expected, got = (torch.tensor(float(c), dtype=torch.float64) for c in counts)
            out.append(compare(expected, got, tensor=f"{name}.step", step=step, rank=rank))
    return out


def forward_loss(spec: TrainingSpec, model: nn.Module, rank: int, batch: int, device: torch.device) -> Tensor:
    """``rank``'s loss on micro-batch ``batch``, its forward run as the spec declares (``Precision.forward``)."""
    with precision_of(spec).forward(device):
        return spec.loss(model, rank, batch, device)


def _batch(spec: TrainingSpec, step: int, micro: int) -> int:
    """The data index of a step's micro-batch: the step itself where a step has one."""
    return step * accumulation_of(spec).micro_batches + micro


def _loss_name(spec: TrainingSpec, micro: int) -> str:
    return "loss" if accumulation_of(spec).micro_batches == 1 else f"loss[micro {micro}]"


@dataclass(frozen=True)
class AroundSpec:
    """A case around a training spec (the twins, a pipeline): it runs on the spec's ranks, with
    its candidate and reference, so the session's candidate goes into the spec
    (``harness.runner.adapt``)."""

    spec: Any

    @property
    def world_size(self) -> int:
        return int(self.spec.world_size)

    @property
    def candidate(self) -> Any:
        return self.spec.candidate

    @property
    def reference(self) -> Any:
        return self.spec.reference


@dataclass(frozen=True)
class TwinsCase(AroundSpec):
    """A model to train as two FSDP2 twins (``run_training_twins``), ``accumulate``
    micro-batches per step; with ``tp`` 2, FSDP2 × TP on a ``(dp, tp)`` mesh of ``(2, 2)``
    (the spec's ``tp_plan`` by ``parallelize_module`` on ``tp``, then FSDP2 on ``dp``)."""

    accumulate: int = 1
    tp: int = 1

    def __post_init__(self) -> None:
        if self.tp > 1 and self.world_size != 2 * self.tp:
            raise ValueError(f"tp={self.tp} on {self.world_size} ranks: FSDP2 × TP twins run on a (2, tp) mesh")

    @property
    def layout(self) -> Layout:
        return FSDP_TP if self.tp > 1 else FSDP

    def describe(self) -> str:
        layout = f" · FSDP2 × TP (2×{self.tp})" if self.tp > 1 else ""
        return f"{self.spec.describe()} · twins{layout} · {self.accumulate} micro-batches per step"


def run_training_twins(ctx: RankContext, case: TwinsCase) -> TaskResult:
    """The same FSDP2 model twice from one seed, on this rank's micro-batches, accumulated
    over ``accumulate`` of them per step (``set_requires_gradient_sync`` off for all but the
    last): one twin steps with the candidate; the other with the reference on the full
    gathered parameters and gradients, each rank then keeping its own piece. Both twins run
    the same forward and backward collectives, so gradients, parameters and optimizer state
    must agree bit for bit at any world size: a claim about the optimizer alone, with none
    of FSDP2's reduction order in it. Under FSDP2 × TP the ranks of a ``tp`` group share
    their ``dp`` rank's micro-batches."""
    from torch.distributed.tensor.parallel import parallelize_module

    spec, accumulate = case.spec, case.accumulate
    device = torch.device(ctx.device)
    model = spec.build().to(device)
    twin = copy.deepcopy(model)
    if case.tp > 1:
        mesh = mesh_for(ctx, (2, case.tp), layout=FSDP_TP)
        for m in (model, twin):
            parallelize_module(m, mesh["tp"], spec.tp_plan())
            spec.shard(m, mesh["dp"])
        data_rank = mesh["dp"].get_local_rank()
    else:
        mesh = mesh_for(ctx, (spec.world_size,))
        for m in (model, twin):
            spec.shard(m, mesh)
        data_rank = ctx.rank
    opt = candidate_optimizer(spec, model)
    full = {name: nn.Parameter(_whole(p).detach().clone()) for name, p in twin.named_parameters()}
    ref_opt = reference_optimizer(spec, _Params(full))
    names, twins = dict(model.named_parameters()), dict(twin.named_parameters())
    records: list[Comparison] = []
    for step in range(spec.steps):
        for micro in range(accumulate):
            last = micro == accumulate - 1
            for m in (model, twin):
                m.set_requires_gradient_sync(last)  # type: ignore[operator]
                forward_loss(spec, m, data_rank, step * accumulate + micro, device).backward()
        for name, p in twins.items():
            grad, cand = None if p.grad is None else _whole(p.grad), names[name].grad
            full[name].grad = grad
            if grad is not None and cand is not None:
                records.append(compare_shard(f"{name}.grad", step, ctx.rank, grad, cand))
        ref_opt.step()
        opt.step()
        for m, o in ((model, opt), (twin, ref_opt)):
            o.zero_grad()
            m.zero_grad()
        with torch.no_grad():
            for name, p in twins.items():
                local_of(p).copy_(local_piece(full[name].detach(), p))
        pairs = ((name, full[name], names[name]) for name in full)
        records += compare_params_and_state(
            pairs, ref_opt, opt, step=step, rank=ctx.rank, keys=reference_of(spec).state
        )
    return TaskResult(tuple(records))


class _Params(nn.Module):
    """Full tensors by their model names, for ``model_groups``."""

    def __init__(self, params: dict[str, nn.Parameter]) -> None:
        super().__init__()
        self._named = params

    def named_parameters(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return iter(self._named.items())


def _whole(t: Tensor) -> Tensor:
    """A DTensor's full value (every rank takes part); a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _resumed(
    ctx: RankContext, spec: TrainingSpec, mesh: Any, side: tuple[nn.Module, torch.optim.Optimizer, Any], device: Any
) -> tuple[nn.Module, torch.optim.Optimizer, Any] | None:
    """The sharded side saved (model and optimizer with DCP, the schedule's ``state_dict``) by
    all its ranks and loaded into a fresh model of other values laid out again, a fresh
    optimizer and a fresh schedule (``harness.models.step.Resume``), on the resume's ranks
    (``Resume.world``: ranks ``0 .. world-1`` on a mesh of their own; ``None`` on a rank left
    out); the spec restores the schedule (``restored``)."""
    model, opt, schedule = side
    path = checkpoint_dir(ctx, params_bytes(model.parameters()))
    dcp_save(model, opt, path, ctx.group)
    saved = schedule.state_dict()
    world = resume_of(spec).world or ctx.world_size
    if ctx.rank >= world:
        return None  # the save is whole once dcp.save returns on every rank; the others load it
    group = ctx.group if world == ctx.world_size else ctx.world_groups[world]
    if world != ctx.world_size:
        mesh = mesh_for(ctx, (world,))
    fresh = spec.build().to(device)
    with torch.no_grad():
        for p in fresh.parameters():
            p.add_(1.0)  # other values than the saved ones, so that only the load can give them back
    spec.shard(fresh, mesh)
    fresh_opt = candidate_optimizer(spec, fresh)
    fresh_schedule = resume_of(spec).on(fresh_opt)
    dcp_load(fresh, fresh_opt, path, group)
    cast(Any, spec).restored(fresh_opt, fresh_schedule, saved)  # only a TransformerCase declares a resume
    remove_checkpoint(ctx, path, group)
    return fresh, fresh_opt, fresh_schedule


def _reference_step_grads(model: nn.Module, spec: TrainingSpec, step: int, device: torch.device) -> list[list[Tensor]]:
    """Each rank's micro-batch losses on the reference, computed in the spec's declared precision;
    ``.grad`` becomes their gradients reduced as the declared step reduces them
    (``harness.models.step.one_device_gradients``)."""
    accumulation = accumulation_of(spec)
    computed = precision_of(spec).computed_on(model)
    inputs = list(computed.parameters())
    grads: list[list[Any]] = []
    losses: list[list[Tensor]] = []
    for rank in range(spec.world_size):
        grads.append([])
        losses.append([])
        for micro in range(accumulation.micro_batches):
            loss = forward_loss(spec, computed, rank, _batch(spec, step, micro), device)
            grads[rank].append(torch.autograd.grad(accumulation.scaled(loss), inputs, allow_unused=True))
            losses[rank].append(loss.detach())
    params = list(model.parameters())
    for p, grad in zip(params, one_device_gradients(grads, params, spec), strict=True):
        p.grad = grad
    return losses


def warm_up(ctx: RankContext, spec: TrainingSpec) -> None:
    """One forward and backward of ``spec``'s model under FSDP2, no optimizer step.

    A fresh rank spends seconds on its first FSDP2 step (CUDA, NCCL, DTensor caches): this
    spends them outside any deadline. No optimizer, because the collectives an optimizer
    issues are not all supported under ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` on NCCL."""
    device = torch.device(ctx.device)
    model = spec.build().to(device)
    spec.shard(model, training_mesh(ctx, spec))
    forward_loss(spec, model, ctx.rank, 0, device).backward()


# -- training for its own sake (``python -m harness.train``) ---------------------------------
_RUNS: dict[str, tuple[nn.Module, torch.optim.Optimizer]] = {}


def train_steps(ctx: RankContext, payload: tuple[str, TrainingSpec, int, int]) -> TaskResult:
    """Steps ``first .. first + count - 1`` of run ``run_id`` with FSDP2 + the candidate only.

    The model and optimizer stay in this rank process between calls (one run at a time),
    so the parent can show progress between chunks. Returns the mean over ranks of the
    training loss at each step and the held-out figure after the last one, in bits per byte.
    """
    import torch.distributed as dist

    run_id, spec, first, count = payload
    device = torch.device(ctx.device)
    if run_id not in _RUNS:
        _RUNS.clear()
        model = spec.build().to(device)
        spec.shard(model, mesh_for(ctx, (spec.world_size,)))
        opt = candidate_optimizer(spec, model)
        _RUNS[run_id] = (model, opt)
    model, opt = _RUNS[run_id]
    losses = []
    for step in range(first, first + count):
        loss = forward_loss(spec, model, ctx.rank, step, device)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    bits: list[float] = []
    if losses:
        mean = torch.stack(losses)
        dist.all_reduce(mean, group=ctx.group)
        bits = (mean / spec.world_size / math.log(2)).tolist()
    return TaskResult(figures={"train_bits": bits, "held_out_bits": spec.evaluate(model, device)})
