"""What a rank does with an optimizer ``Case``: build identical inputs, run the reference and
the candidate side by side, and compare every tensor of every step.

Both sides get identical inputs: parameters and gradients are drawn on the CPU from the
case's seed (the same on every rank), moved to the device, and only then sharded. The
candidate's parameters are real FSDP2 parameters (``fully_shard`` of a module holding
them, or another layout: ``harness.tasks.layouts``); gradients are fed as DTensors with the
parameters' placement, as FSDP2's reduce-scatter would leave them. Every rank runs the
single-device reference on the full tensors and compares its own shard, so no rank needs
anyone else's data to judge, and no rank raises inside a collective: the verdicts go back
to the parent. ``run_backward_case`` computes the gradients instead, with FSDP2's own backward.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import reference
from harness import layouts
from harness.algorithms import reference_of
from harness.candidates import declaration_of
from harness.cases.case import Case, ParamSpec
from harness.cases.tensors import generator, gradient, initial_param
from harness.ranks import RankContext
from harness.tasks.checkpoint import checkpoint_dir, dcp_load, dcp_save, params_bytes, remove_checkpoint
from harness.tasks.clipping import clip_step, tie
from harness.tasks.common import PIECE, local_of, local_piece, mesh_for, read_own_sharding, shard_like
from harness.tasks.layouts import build_model, case_param, zeros_of
from harness.tasks.phases import Phases
from harness.tasks.qk_clip import qk_clip_step
from harness.tasks.result import TaskResult
from harness.tasks.routing import FirstStep, audit
from harness.tasks.sides import (
    Side,
    against_reference,
    against_twin,
    by_name,
    candidate_side,
    reference_side,
    starts_of,
    twin_side,
    unparallel,
)
from reports.records import Comparison


def run_routing_case(ctx: RankContext, case: Case) -> TaskResult:
    """``run_optimizer_case`` with the routing audit (``harness.tasks.routing``): which algorithm
    stepped each parameter, by its first step, on this rank."""
    return run_optimizer_case(ctx, case, audited=True)


def run_optimizer_case(ctx: RankContext, case: Case, *, audited: bool = False) -> TaskResult:
    """Runs one case on this rank; its comparisons after every step (``audited``: and the routes
    its parameters stepped by, which only the routing gates judge: the audit steps a reference
    once per route and parameter)."""
    phases = Phases()
    device = torch.device(ctx.device)
    tensors = [initial_param(s, case.seed, i).to(device) for i, s in enumerate(case.params)]
    starts = starts_of(case, tensors)
    phases.lap("inputs")
    mesh = mesh_for(ctx, case.mesh, layout=case.layout)
    ref = reference_side(case, tensors)
    ref_by_name = by_name(ref)
    model = build_model(case, tensors, mesh)
    opt = candidate_side(case, model)
    tie(case, model)
    twin = twin_side(ctx, case, unparallel(case, tensors)) if case.self_reference else None
    phases.lap("set-up (mesh, fully_shard, optimizers)")
    records: list[Comparison] = []
    # the routing audit's evidence: each parameter's first step, before and after (harness.tasks.routing)
    first: dict[str, FirstStep] = {}
    routed = audited and ref is not None and bool(reference_of(case).routes)
    for step in range(case.steps):
        for i, spec in enumerate(case.params):
            g = gradient(spec, case.seed, i, step)
            g = None if g is None else g.to(device)
            mine = g
            if g is not None and spec.grad == "rank_asymmetric":
                g, mine = _on_rank_zero_only(ctx, g, case_param(model, spec.name))
            if ref is not None:
                ref_by_name[spec.name].grad = g
            p = case_param(model, spec.name)
            p.grad = None if mine is None else shard_like(mine, p)
            if twin is not None:
                p = case_param(twin[0], spec.name)
                p.grad = None if g is None else shard_like(g, p)
        phases.lap("inputs")
        if case.clip is not None and ref is not None:
            records += clip_step(case, step, ctx.rank, model, ref_by_name)
            phases.lap("clip (with its collectives)")
        firsts = _first_steps(case, ref_by_name, model, first) if routed else {}
        if ref is not None:
            ref.step()
        phases.lap("reference step")
        opt.step()
        phases.lap("candidate step (with its collectives)")
        for name, (before, grad, mine) in firsts.items():
            first[name] = FirstStep(before, grad, local_of(case_param(model, name)).detach().float() - mine)
        if case.qk_clip is not None:
            qk_clip_step(case, step, model, mesh, ref_by_name)
            phases.lap("QK-clip (with its collectives)")
        if twin is not None:
            twin[1].step()
            phases.lap("candidate on one device")
        if case.checkpoint_after is not None and step + 1 == case.checkpoint_after:
            model, opt = _round_trip(case, (model, opt), mesh, ctx)
            phases.lap("checkpoint round trip")
        records += against_reference(case, step, ctx.rank, ref, opt, model, starts)
        if twin is not None:
            records += against_twin(case, step, ctx.rank, twin, opt, model)
        phases.lap("compare")
    phases.keep()
    routes = audit(case, ref, opt, model, ctx.rank, first) if audited else ()
    return TaskResult(tuple(records), routes=routes)


def _first_steps(
    case: Case, ref_by_name: dict[str, Tensor], model: nn.Module, seen: dict[str, FirstStep]
) -> dict[str, tuple[Tensor, Tensor, Tensor]]:
    """Each parameter about to take its first step (a gradient, and none before): the full value
    and gradient the reference steps from, and this rank's piece of the candidate before it."""
    out = {}
    for spec in case.params:
        ref_p = ref_by_name[spec.name]
        if spec.name in seen or ref_p.grad is None:
            continue
        mine = local_of(case_param(model, spec.name)).detach().float().clone()
        out[spec.name] = (ref_p.detach().clone(), ref_p.grad.detach().clone(), mine)
    return out


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


def _round_trip(case: Case, side: Side, mesh: DeviceMesh, ctx: RankContext) -> Side:
    """Saves model and optimizer with DCP, loads them into a fresh model and optimizer."""
    path = checkpoint_dir(ctx, params_bytes(side[0].parameters()))
    dcp_save(*side, path, ctx.group)
    fresh = build_model(case, zeros_of(case, ctx.device), mesh)
    fresh_opt = candidate_side(case, fresh)
    dcp_load(fresh, fresh_opt, path, ctx.group)
    remove_checkpoint(ctx, path)
    return fresh, fresh_opt


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
        reference=reference.Muon,
    )


def _mlp(case: Case, tensors: list[Tensor], mesh: DeviceMesh | None) -> nn.Module:
    """The two-layer MLP of ``backward_model_case`` holding ``tensors``, each layer and the
    whole ``fully_shard``-ed on ``mesh`` (``None``: left plain); laid out by the candidate's own
    ``shard`` instead where the case is given to it (``layouts.OWN``: torchtitan names its mesh's
    axis, and a mesh of another name was refused by its ``DistMuon``)."""
    (d1, d0), d2 = case.params[0].shape, case.params[1].shape[0]
    model = nn.Sequential(nn.Linear(d0, d1, bias=False), nn.Tanh(), nn.Linear(d1, d2)).to(tensors[0].device)
    with torch.no_grad():
        for spec, t in zip(case.params, tensors, strict=True):
            model.get_parameter(spec.name).copy_(t)
    if mesh is not None and case.layout == layouts.OWN:
        own = declaration_of(case.candidate).shard
        assert own is not None, f"{case.candidate} declares no shard of its own"
        own(model, mesh)
        named = ((s.name, model.get_parameter(s.name), torch.Size(s.shape)) for s in case.params)
        read_own_sharding(named, case.candidate, mesh.get_rank())
    elif mesh is not None:
        for module in (model[0], model[2], model):
            fully_shard(module, mesh=mesh)
    return model


def run_backward_case(ctx: RankContext, case: Case) -> TaskResult:
    """FSDP2 forward and backward on per-rank micro-batches; the reference is fed the
    gradients FSDP2 produced (gathered), so the claim is the optimizer after a real backward."""
    device = torch.device(ctx.device)
    d0 = case.params[0].shape[1]
    tensors = [initial_param(s, case.seed, i).to(device) for i, s in enumerate(case.params)]
    starts = starts_of(case, tensors)
    ref = reference_side(case, tensors)
    ref_by_name = by_name(ref)
    model = _mlp(case, tensors, mesh_for(ctx, case.mesh))
    opt = candidate_side(case, model)
    twin = twin_side(ctx, case, lambda m: _mlp(case, tensors, m)) if case.self_reference else None
    records: list[Comparison] = []
    for step in range(case.steps):
        x = torch.randn(4, d0, generator=generator(case.seed, ctx.rank, step)).to(device)
        model(x).square().mean().backward()
        for spec in case.params:
            grad = model.get_parameter(spec.name).grad
            full = grad.full_tensor() if isinstance(grad, DTensor) else grad
            if ref is not None:
                ref_by_name[spec.name].grad = full
            if twin is not None:
                p = case_param(twin[0], spec.name)
                p.grad = None if full is None else shard_like(full, p)
        if ref is not None:
            ref.step()
        opt.step()
        opt.zero_grad()
        records += against_reference(case, step, ctx.rank, ref, opt, model, starts)
        if twin is not None:
            twin[1].step()
            records += against_twin(case, step, ctx.rank, twin, opt, model)
    return TaskResult(tuple(records))
