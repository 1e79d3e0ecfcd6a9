"""What a rank does with an optimizer ``Case``: build identical inputs, run the reference and
the candidate side by side, and compare every tensor of every step.

Both sides get identical inputs: parameters and gradients are drawn on the CPU from the
case's seed (the same on every rank), moved to the device, and only then sharded. The
candidate's parameters are real FSDP2 parameters (``fully_shard`` of a module holding
them); gradients are fed as DTensors with the parameters' placement, as FSDP2's
reduce-scatter would leave them. Every rank runs the single-device reference on the full
tensors and compares its own shard, so no rank needs anyone else's data to judge, and
no rank raises inside a collective: the verdicts go back to the parent.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

import reference
from harness.algorithms import reference_of
from harness.candidates.declaration import declaration_of
from harness.candidates.kernel import orthogonalizer
from harness.cases.case import Case, ParamSpec, ReshardCase
from harness.cases.tensors import generator, gradient, initial_param, spectrum_matrix
from harness.compare import compare
from harness.ranks import RankContext
from harness.tasks.checkpoint import checkpoint_dir, dcp_load, dcp_save, remove_checkpoint
from harness.tasks.common import (
    PIECE,
    compare_params_and_state,
    factory_of,
    local_of,
    local_piece,
    mesh_for,
    param_groups,
    read_own_sharding,
    shard_like,
    whole,
    whole_of_piece,
)
from harness.tasks.result import TaskResult
from reports.records import Comparison


class _Holder(nn.Module):
    """The case's parameters, by name; under tensor parallelism each matrix is the weight of
    an ``nn.Linear`` of its own (what ``parallelize_module`` takes)."""

    def __init__(self, tensors: dict[str, Tensor], *, linears: bool = False) -> None:
        super().__init__()
        self.paths: dict[str, str] = {}
        for name, t in tensors.items():
            if linears and t.ndim == 2:
                linear = nn.Linear(t.shape[1], t.shape[0], bias=False, device=t.device, dtype=t.dtype)
                with torch.no_grad():
                    linear.weight.copy_(t)
                self.add_module(name, linear)
                self.paths[name] = f"{name}.weight"
            else:
                self.register_parameter(name, nn.Parameter(t.clone()))

    def param(self, name: str) -> Tensor:
        return self.get_parameter(self.paths.get(name, name))


def case_param(model: nn.Module, name: str) -> Tensor:
    """A case parameter of a model the task built (``_Holder``) or of the backward MLP."""
    return model.param(name) if isinstance(model, _Holder) else model.get_parameter(name)


def _groups(case: Case, params: Sequence[Tensor]) -> list[dict[str, Any]]:
    """A hybrid reference's (Muon's) two groups, or one group of every parameter."""
    named = [(s.name, p, s.use_muon) for s, p in zip(case.params, params, strict=True)]
    if reference_of(case).hybrid:
        return param_groups(named)
    return [{"params": [p for _, p, _ in named], "param_names": [n for n, _, _ in named]}]


def _kernel(case: Case) -> Callable[..., Tensor] | None:
    """The case's ``--kernel`` behind the reference's ``orthogonalize`` signature, if any."""
    return orthogonalizer(case.kernel) if case.kernel else None


def _reference(case: Case, tensors: list[Tensor]) -> torch.optim.Optimizer:
    """The case's reference (``harness.algorithms``) on plain copies of the full tensors."""
    plain: list[Tensor] = [nn.Parameter(t.clone()) for t in tensors]
    kernel = {"orthogonalize_fn": _kernel(case)} if case.kernel else {}
    return cast(
        torch.optim.Optimizer, reference_of(case).factory(_groups(case, plain), **kernel, **case.settings_dict())
    )


def _candidate(case: Case, model: nn.Module, factory: Any = None) -> torch.optim.Optimizer:
    params = [case_param(model, s.name) for s in case.params]
    # Every reference setting, defaults included: a plug-in gets the whole configuration.
    defaults = reference_of(case).defaults
    kwargs = {k: v for k, v in {**defaults, **case.settings_dict()}.items() if k != "use_muon"}
    if case.mode is not None:
        kwargs["mode"] = case.mode
    if case.kernel:
        kwargs["orthogonalize_fn"] = _kernel(case)
    return (factory or factory_of(case.candidate))(_groups(case, params), **kwargs)


def build_model(
    case: Case, tensors: list[Tensor], mesh: DeviceMesh | None, *, parallel: bool = True, linears: bool = False
) -> nn.Module:
    """The case's parameters in a module laid out as users lay them out: ``fully_shard`` on
    ``mesh`` (``None``: left plain); with ``case.tp > 1`` (and ``parallel``), ``parallelize_module``
    on the ``tp`` dim by each matrix's style, then ``fully_shard`` on ``dp`` (or HSDP on
    ``(rep, dp)``) where there is one;
    with ``case.ep > 1`` (and ``parallel``), expert parallelism (``_expert_parallel``).
    ``linears``: matrices as ``nn.Linear`` weights in every layout, so that their names
    (``w0.weight``) are the same on every layout (what a checkpoint resharded across them needs)."""
    named = {s.name: t for s, t in zip(case.params, tensors, strict=True)}
    own = declaration_of(case.candidate).shard
    if mesh is not None and own is not None:
        model = _Holder(named, linears=linears)
        own(model, mesh)
        read_own_sharding(((n, model.param(n), t.shape) for n, t in named.items()), case.candidate, mesh.get_rank())
        return model
    if mesh is not None and case.ep > 1 and parallel:
        return _expert_parallel(named, mesh)
    if mesh is None or case.tp == 1 or not parallel:
        model = _Holder(named, linears=linears)
        if mesh is not None:
            fully_shard(model, mesh=mesh)
        return model
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    model = _Holder(named, linears=True)
    tp_mesh = mesh["tp"] if mesh.ndim > 1 else mesh
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = {s.name: styles[s.style]() for s in case.params if s.style in styles and s.name in model.paths}
    parallelize_module(model, tp_mesh, plan)
    for s in case.params:
        if s.name not in plan:  # replicated over tp, as parallelize_module leaves what it does not shard
            owner = model.get_submodule(s.name) if s.name in model.paths else model
            leaf = "weight" if s.name in model.paths else s.name
            t = getattr(owner, leaf)
            owner.register_parameter(leaf, nn.Parameter(distribute_tensor(t.detach(), tp_mesh, [Replicate()])))
    if mesh.ndim > 1:
        fully_shard(model, mesh=mesh["dp"] if mesh.ndim == 2 else mesh["rep", "dp"])
    return model


def _expert_parallel(named: dict[str, Tensor], mesh: DeviceMesh) -> nn.Module:
    """Expert parallelism on ``(ep, efsdp)``: each 3-D stack's experts split over ``ep`` and its
    rows over ``efsdp`` (``distribute_tensor``, as an expert-parallel plan leaves them);
    every other parameter HSDP-like, replicated over ``ep`` and sharded over ``efsdp``."""
    model = _Holder(named)
    for name, t in named.items():
        placements = [Shard(0), Shard(1)] if t.ndim == 3 else [Replicate(), Shard(0)]
        model.register_parameter(name, nn.Parameter(distribute_tensor(t, mesh, placements, src_data_rank=None)))
    return model


def _twin(
    ctx: RankContext, case: Case, build: Callable[[DeviceMesh | None], nn.Module]
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The candidate as its own single-device self, on the model ``build`` makes: with the
    counterpart it declares (``single_device``) on plain tensors, or else itself on a
    one-rank FSDP2 mesh of this rank alone."""
    single = declaration_of(factory_of(case.candidate)).single_device
    if single is not None:
        model = build(None)
        return model, _candidate(case, model, single)
    model = build(DeviceMesh.from_group(ctx.solo_group, torch.device(ctx.device).type, mesh_dim_names=("shard",)))
    return model, _candidate(case, model)


def _single(case: Case, tensors: list[Tensor]) -> Callable[[DeviceMesh | None], nn.Module]:
    """How the twin builds the case's model: FSDP2 on its one-rank mesh, without the case's TP or EP."""
    return lambda mesh: build_model(case, tensors, mesh, parallel=False)


class _Phases:
    """Wall-clock seconds per phase of the last case on this rank (read by ``last_phases``)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._mark = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._mark
        self._mark = now


_LAST_PHASES: dict[str, float] = {}


def last_phases(ctx: RankContext, payload: Any) -> dict[str, float]:
    """Where the previous optimizer case's time went on this rank."""
    return dict(_LAST_PHASES)


def run_optimizer_case(ctx: RankContext, case: Case) -> TaskResult:
    """Runs one case on this rank; its comparisons after every step."""
    phases = _Phases()
    device = torch.device(ctx.device)
    tensors = [initial_param(s, case.seed, i).to(device) for i, s in enumerate(case.params)]
    phases.lap("inputs")
    mesh = mesh_for(ctx, case.mesh, layout=case.layout)
    ref = _reference(case, tensors)
    ref_by_name = _by_name(ref)
    model = build_model(case, tensors, mesh)
    opt = _candidate(case, model)
    twin = _twin(ctx, case, _single(case, tensors)) if case.self_reference else None
    phases.lap("set-up (mesh, fully_shard, optimizers)")
    records: list[Comparison] = []
    for step in range(case.steps):
        for i, spec in enumerate(case.params):
            g = gradient(spec, case.seed, i, step)
            g = None if g is None else g.to(device)
            mine = g
            if g is not None and spec.grad == "rank_asymmetric":
                g, mine = _on_rank_zero_only(ctx, g, case_param(model, spec.name))
            ref_by_name[spec.name].grad = g
            p = case_param(model, spec.name)
            p.grad = None if mine is None else shard_like(mine, p)
            if twin is not None:
                p = case_param(twin[0], spec.name)
                p.grad = None if g is None else shard_like(g, p)
        phases.lap("inputs")
        ref.step()
        phases.lap("reference step")
        opt.step()
        phases.lap("candidate step (with its collectives)")
        if twin is not None:
            twin[1].step()
            phases.lap("candidate on one device")
        if case.checkpoint_after is not None and step + 1 == case.checkpoint_after:
            model, opt = _round_trip(case, model, opt, mesh, ctx)
            phases.lap("checkpoint round trip")
        records += _compare_step(case, step, ctx.rank, ref, ref_by_name, opt, model)
        if twin is not None:
            records += _compare_twin(case, step, ctx.rank, twin, opt, model)
        phases.lap("compare")
    _LAST_PHASES.clear()
    _LAST_PHASES.update(phases.seconds)
    return TaskResult(tuple(records))


def _compare_step(
    case: Case,
    step: int,
    rank: int,
    ref: torch.optim.Optimizer,
    ref_by_name: dict[str, Tensor],
    opt: torch.optim.Optimizer,
    model: nn.Module,
) -> list[Comparison]:
    """This rank's pieces against the reference's (none under ``--reference none``)."""
    if reference_of(case).factory is None:
        return []
    pairs = ((s.name, ref_by_name[s.name], case_param(model, s.name)) for s in case.params)
    return compare_params_and_state(pairs, ref, opt, step=step, rank=rank, keys=reference_of(case).state)


def _on_rank_zero_only(ctx: RankContext, g: Tensor, p: Tensor) -> tuple[Tensor, Tensor | None]:
    """A gradient only rank 0 has (``grad="rank_asymmetric"``): the full gradient a reference
    sees if the missing pieces count as zeros, and this rank's gradient (``None`` off rank 0).
    The pieces are laid out by DTensor itself; every rank joins the one gather."""
    if getattr(p, PIECE, None) is not None:  # a plain piece of a candidate's own sharding
        held = [getattr(p, PIECE)]
        dist.broadcast_object_list(held, src=dist.get_global_rank(ctx.group, 0), group=ctx.group)
        mine = g if ctx.rank == 0 else None
        if tuple(p.shape) == tuple(g.shape):  # a whole copy is a replica, as under Replicate() below
            return (g if mine is not None else torch.zeros_like(g)), mine
        full = torch.zeros_like(g)
        full[held[0]] = g[held[0]]
        return full, mine
    if not isinstance(p, DTensor) or ctx.world_size == 1:
        return g, g
    piece = local_piece(g, p)
    kept = piece if ctx.rank == 0 else torch.zeros_like(piece)
    full = DTensor.from_local(kept, p.device_mesh, p.placements, shape=p.shape, stride=p.stride()).full_tensor()
    return full, (g if ctx.rank == 0 else None)


def _compare_twin(
    case: Case,
    step: int,
    rank: int,
    twin: tuple[nn.Module, torch.optim.Optimizer],
    opt: torch.optim.Optimizer,
    model: nn.Module,
) -> list[Comparison]:
    """This rank's pieces against the candidate's own single-device result (``against="self"``)."""
    twin_model, twin_opt = twin
    pairs = ((s.name, case_param(twin_model, s.name), case_param(model, s.name)) for s in case.params)
    return [
        dataclasses.replace(c, against="self")
        for c in compare_params_and_state(pairs, twin_opt, opt, step=step, rank=rank, keys=reference_of(case).state)
    ]


def _zeros(case: Case, device: str | torch.device) -> list[Tensor]:
    """Zero tensors of the case's parameters' shapes and dtypes (a fresh model to load into)."""
    return [torch.zeros(s.shape, dtype=getattr(torch, s.dtype), device=device) for s in case.params]


def _round_trip(
    case: Case, model: nn.Module, opt: torch.optim.Optimizer, mesh: DeviceMesh, ctx: RankContext
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Saves model and optimizer with DCP, loads them into a fresh model and optimizer."""
    path = checkpoint_dir(ctx)
    dcp_save(model, opt, path, ctx.group)
    fresh = build_model(case, _zeros(case, ctx.device), mesh)
    fresh_opt = _candidate(case, fresh)
    dcp_load(fresh, fresh_opt, path, ctx.group)
    remove_checkpoint(ctx, path)
    return fresh, fresh_opt


def run_update_case(ctx: RankContext, case: Case) -> TaskResult:
    """One step from the case's weights; the update the candidate applied (new minus old
    weights, float32), gathered whole (DTensor's ``full_tensor``, or a candidate's own pieces
    put together: ``whole_of_piece``), against the
    reference's, in the case's tier, or else ``harness.compare.GRAM_PARTIAL`` for its Newton–Schulz
    dtype (judged on rank 0: the tiers were calibrated on whole matrices, and a small piece's
    relative error is larger). With no weight decay the update is ``-lr·scale·O``, so the
    tier judges the orthogonalization itself."""
    from harness.compare import GRAM_PARTIAL

    device = torch.device(ctx.device)
    tensors = [initial_param(s, case.seed, i).to(device) for i, s in enumerate(case.params)]
    ref = _reference(case, tensors)
    ref_by_name = _by_name(ref)
    mesh = mesh_for(ctx, case.mesh, layout=case.layout)
    model = build_model(case, tensors, mesh)
    opt = _candidate(case, model)
    params = {s.name: case_param(model, s.name) for s in case.params}
    before = {name: local_of(p).float().clone() for name, p in params.items()}
    for i, spec in enumerate(case.params):
        g = cast(Tensor, gradient(spec, case.seed, i, 0)).to(device)
        ref_by_name[spec.name].grad = g
        params[spec.name].grad = shard_like(g, params[spec.name])
    ref.step()
    opt.step()
    tier = case.tier or GRAM_PARTIAL[str(case.settings_dict().get("ns_dtype", torch.bfloat16)).removeprefix("torch.")]
    records = []
    for t, spec in zip(tensors, case.params, strict=True):
        p = params[spec.name]
        local = local_of(p).float() - before[spec.name]
        actual = whole_of_piece(local, p, spec.shape, mesh.get_group() if mesh.ndim == 1 else None)
        if ctx.rank == 0:
            expected = ref_by_name[spec.name].detach().float() - t.float()
            records.append(compare(expected, actual, tensor=f"{spec.name}.update", rank=0, tier=tier))
    return TaskResult(tuple(records))


def run_reshard_case(ctx: RankContext, rc: ReshardCase) -> TaskResult:
    """The first ``rc.at`` steps on ``rc.before``'s layout, saved with DCP by its ranks; a fresh
    model and optimizer on ``rc.after``'s layout load it and run the rest. Every rank runs the
    reference through every step; each phase's ranks compare their pieces with it."""
    device = torch.device(ctx.device)
    case = rc.after
    tensors = [initial_param(s, case.seed, i).to(device) for i, s in enumerate(case.params)]
    ref = _reference(case, tensors)
    ref_by_name = _by_name(ref)
    path = checkpoint_dir(ctx)

    def on(side: Case, start: list[Tensor]) -> tuple[nn.Module, torch.optim.Optimizer] | None:
        if ctx.rank >= side.world_size:
            return None
        model = build_model(side, start, mesh_for(ctx, side.mesh, layout=side.layout), linears=True)
        return model, _candidate(side, model)

    def group(side: Case) -> Any:
        return ctx.group if side.world_size == ctx.world_size else ctx.world_groups.get(side.world_size)

    running = on(rc.before, tensors)
    records: list[Comparison] = []
    for step in range(case.steps):
        side = rc.before if step < rc.at else rc.after
        for i, spec in enumerate(case.params):
            g = gradient(spec, case.seed, i, step)
            ref_by_name[spec.name].grad = None if g is None else g.to(device)
            if running is not None:
                p = case_param(running[0], spec.name)
                p.grad = None if g is None else shard_like(g.to(device), p)
        ref.step()
        if running is not None:
            running[1].step()
            pairs = ((s.name, ref_by_name[s.name], case_param(running[0], s.name)) for s in case.params)
            records += compare_params_and_state(
                pairs, ref, running[1], step=step, rank=ctx.rank, keys=reference_of(case).state
            )
        if step + 1 == rc.at:
            if running is not None:
                dcp_save(*running, path, group(side))
            dist.barrier(group=ctx.group)
            running = on(rc.after, _zeros(case, device))
            if running is not None:
                dcp_load(*running, path, group(rc.after))
    remove_checkpoint(ctx, path)
    return TaskResult(tuple(records))


def run_orthogonalize_case(ctx: RankContext, case: Case) -> TaskResult:
    """Gathers each matrix of the case from its shards, orthogonalizes it ``ShardedMuon``'s way
    (``case.mode``), and compares this rank's rows with the reference's full-matrix result.
    This judges muongate's own placement and exchange code, not a candidate."""
    from distributed_impl import placement
    from distributed_impl.exchange import OwnerExchange

    device = torch.device(ctx.device)
    settings = {**reference.MUON_DEFAULTS, **case.settings_dict()}
    ns = reference.group_orthogonalizer(settings, _kernel(case))

    mesh = mesh_for(ctx, case.mesh)
    fulls = [initial_param(s, case.seed, i).to(device).to(settings["ns_dtype"]) for i, s in enumerate(case.params)]
    shards = [
        distribute_tensor(f, mesh, [*[Replicate()] * (mesh.ndim - 1), Shard(0)], src_data_rank=None) for f in fulls
    ]
    locals_ = [s.to_local() for s in shards]
    if case.mode == "owner_split":
        # Tiny buckets: several exchanges per step, overlapping, as at scale.
        arrived: dict[int, Tensor] = {}
        OwnerExchange(bucket_numel=256).run(
            shards,
            lambda k, out: out.copy_(locals_[k]),
            lambda matrices: [ns(m) for m in matrices],
            arrived.__setitem__,
            dtype=settings["ns_dtype"],
        )
        got = [arrived[k] for k in range(len(shards))]
    else:
        got = [placement.local_rows(ns(placement.gather_full(u, s)), s) for u, s in zip(locals_, shards, strict=True)]
    records = []
    for spec, full, shard, mine in zip(case.params, fulls, shards, got, strict=True):
        expected = local_piece(ns(full), shard)
        records.append(compare(expected, mine, tensor=spec.name, rank=ctx.rank))
    return TaskResult(tuple(records))


def backward_model_case(seed: int, dims: tuple[int, int, int], world_size: int, steps: int, mode: str) -> Case:
    """A two-layer MLP's parameters as a case: two Muon matrices and an AdamW bias."""
    d0, d1, d2 = dims
    return Case(
        params=(
            ParamSpec("0.weight", (d1, d0)),
            ParamSpec("2.weight", (d2, d1)),
            ParamSpec("2.bias", (d2,), use_muon=False),
        ),
        seed=seed,
        world_size=world_size,
        mesh=(world_size,),
        steps=steps,
        mode=mode,  # type: ignore[arg-type]
        settings=(("weight_decay", 0.01),),
    )


def _mlp(case: Case, tensors: list[Tensor], mesh: DeviceMesh | None) -> nn.Module:
    """The two-layer MLP of ``backward_model_case`` holding ``tensors``, each layer and the
    whole ``fully_shard``-ed on ``mesh`` (``None``: left plain)."""
    (d1, d0), d2 = case.params[0].shape, case.params[1].shape[0]
    model = nn.Sequential(nn.Linear(d0, d1, bias=False), nn.Tanh(), nn.Linear(d1, d2)).to(tensors[0].device)
    with torch.no_grad():
        for spec, t in zip(case.params, tensors, strict=True):
            model.get_parameter(spec.name).copy_(t)
    if mesh is not None:
        for module in (model[0], model[2], model):
            fully_shard(module, mesh=mesh)
    return model


def run_backward_case(ctx: RankContext, case: Case) -> TaskResult:
    """FSDP2 forward and backward on per-rank micro-batches; the reference is fed the
    gradients FSDP2 produced (gathered), so the claim is the optimizer after a real backward."""
    device = torch.device(ctx.device)
    d0 = case.params[0].shape[1]
    tensors = [initial_param(s, case.seed, i).to(device) for i, s in enumerate(case.params)]
    ref = _reference(case, tensors)
    ref_by_name = _by_name(ref)
    model = _mlp(case, tensors, mesh_for(ctx, case.mesh))
    opt = _candidate(case, model)
    twin = _twin(ctx, case, lambda m: _mlp(case, tensors, m)) if case.self_reference else None
    records: list[Comparison] = []
    for step in range(case.steps):
        x = torch.randn(4, d0, generator=generator(case.seed, ctx.rank, step)).to(device)
        model(x).square().mean().backward()
        for spec in case.params:
            grad = model.get_parameter(spec.name).grad
            full = grad.full_tensor() if isinstance(grad, DTensor) else grad
            ref_by_name[spec.name].grad = full
            if twin is not None:
                p = case_param(twin[0], spec.name)
                p.grad = None if full is None else shard_like(full, p)
        ref.step()
        opt.step()
        opt.zero_grad()
        records += _compare_step(case, step, ctx.rank, ref, ref_by_name, opt, model)
        if twin is not None:
            twin[1].step()
            records += _compare_twin(case, step, ctx.rank, twin, opt, model)
    return TaskResult(tuple(records))


def run_spectrum_case(ctx: RankContext, case: Case) -> TaskResult:
    """One candidate step on its first (2-D, Muon) parameter, from zero weights, on a gradient
    with known singular values (``spectrum_matrix``), with no momentum and no weight decay:
    the weights after the step are ``−lr·scale·O``, where ``O`` is the candidate's
    orthogonalization of the gradient. Rank 0 returns ``O``'s singular values (float64),
    gathered with DTensor's own ``full_tensor`` or ``whole`` (every rank takes part)."""
    device = torch.device(ctx.device)
    spec = case.params[0]
    model = build_model(
        case, [torch.zeros(spec.shape, dtype=getattr(torch, spec.dtype), device=device)], mesh_for(ctx, case.mesh)
    )
    opt = _candidate(case, model)
    p = case_param(model, spec.name)
    g = spectrum_matrix(spec.shape[0], spec.shape[1], generator(case.seed)).to(getattr(torch, spec.dtype))
    p.grad = shard_like(g.to(device), p)
    opt.step()
    settings = {**reference.MUON_DEFAULTS, **case.settings_dict()}
    scaled_lr = settings["lr"] * reference.lr_scale(spec.shape, settings["adjust_lr_fn"])
    full = whole(p, spec.shape, ctx.group)
    if ctx.rank != 0:
        return TaskResult()
    o = -full.double().cpu() / scaled_lr
    return TaskResult(figures={"singular_values": torch.linalg.svdvals(o).tolist()})


def _by_name(ref: torch.optim.Optimizer) -> dict[str, Tensor]:
    """The reference's parameters by case name, as its param groups name them."""
    return {name: p for g in ref.param_groups for name, p in zip(g["param_names"], g["params"], strict=True)}
