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

import importlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

import reference
from harness.cases import Case, ParamSpec
from harness.compare import BITWISE, Comparison, Tier, compare
from harness.pool import RankContext

STATE_KEYS = ("momentum_buffer", "exp_avg", "exp_avg_sq")


def load_object(spec: str) -> Any:
    """``'package.module:attr'`` → the object; the error says what was asked for."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{spec!r} is not of the form MODULE:NAME")
    return getattr(importlib.import_module(module_name), attr)


def initial_param(spec: ParamSpec, seed: int, index: int) -> Tensor:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
    return torch.randn(spec.shape, generator=gen).to(getattr(torch, spec.dtype))


def gradient(spec: ParamSpec, seed: int, index: int, step: int) -> Tensor | None:
    """The gradient of parameter ``index`` on ``step``: the same on every rank and both sides."""
    if spec.grad == "none" or (spec.grad == "every_other" and step % 2 == 1):
        return None
    if spec.grad == "zero":
        return torch.zeros(spec.shape, dtype=getattr(torch, spec.dtype))
    gen = torch.Generator().manual_seed(seed * 1_000_003 + index + 7919 * (step + 1))
    return (torch.randn(spec.shape, generator=gen) * spec.grad_scale).to(getattr(torch, spec.dtype))


class _Holder(nn.Module):
    def __init__(self, tensors: dict[str, Tensor]) -> None:
        super().__init__()
        for name, t in tensors.items():
            self.register_parameter(name, nn.Parameter(t.clone()))


def param_groups(case: Case, params: Sequence[Tensor], names: Sequence[str]) -> list[dict[str, Any]]:
    muon = [i for i, s in enumerate(case.params) if s.use_muon]
    other = [i for i, s in enumerate(case.params) if not s.use_muon]
    groups = []
    for use_muon, idx in ((True, muon), (False, other)):
        if idx:
            groups.append(
                {"params": [params[i] for i in idx], "param_names": [names[i] for i in idx], "use_muon": use_muon}
            )
    return groups


def _reference(case: Case, tensors: list[Tensor]) -> reference.Muon:
    plain = [nn.Parameter(t.clone()) for t in tensors]
    return reference.Muon(
        param_groups(case, plain, [s.name for s in case.params]), orthogonalize_fn=_kernel(case), **case.settings_dict()
    )


def _kernel(case: Case) -> Callable[..., Tensor] | None:
    """The case's ``--kernel`` behind the reference's ``orthogonalize`` signature, if any."""
    from harness.kernels import orthogonalizer

    return orthogonalizer(case.kernel) if case.kernel else None


def _candidate(case: Case, model: nn.Module, factory: Callable[..., torch.optim.Optimizer]) -> torch.optim.Optimizer:
    params = [model.get_parameter(s.name) for s in case.params]
    # Every reference setting, defaults included: a plug-in gets the whole configuration.
    kwargs = {k: v for k, v in {**reference.MUON_DEFAULTS, **case.settings_dict()}.items() if k != "use_muon"}
    if case.mode is not None:
        kwargs["mode"] = case.mode
    if case.kernel:
        kwargs["orthogonalize_fn"] = _kernel(case)
    return factory(param_groups(case, params, [s.name for s in case.params]), **kwargs)


def mesh_for(ctx: RankContext, mesh: tuple[int, ...]) -> DeviceMesh:
    """A mesh over the pool's groups made for it at start-up (no group is made here)."""
    device_type = torch.device(ctx.device).type
    if len(mesh) == 1:
        return DeviceMesh.from_group(ctx.group, device_type, mesh_dim_names=("shard",))
    shape = (mesh[0], mesh[-1])
    if len(mesh) != 2 or shape not in ctx.hsdp_groups:
        raise ValueError(f"no HSDP groups for mesh {mesh}: 2-D meshes are (2, w // 2) for even w >= 4")
    layout = torch.arange(ctx.world_size).view(*shape)
    return DeviceMesh.from_group(
        list(ctx.hsdp_groups[shape]), device_type, mesh=layout, mesh_dim_names=("replicate", "shard")
    )


def _model(case: Case, tensors: list[Tensor], mesh: DeviceMesh) -> nn.Module:
    model = _Holder({s.name: t for s, t in zip(case.params, tensors, strict=True)})
    fully_shard(model, mesh=mesh)
    return model


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


def run_optimizer_case(ctx: RankContext, payload: tuple[str, Case]) -> list[dict[str, Any]]:
    """Runs one case on this rank and returns its comparison records."""
    gate, case = payload
    phases = _Phases()
    device = torch.device(ctx.device)
    factory = load_object(case.candidate)
    tensors = [initial_param(s, case.seed, i).to(device) for i, s in enumerate(case.params)]
    phases.lap("inputs")
    mesh = mesh_for(ctx, case.mesh)
    ref = _reference(case, tensors)
    ref_by_name = _by_name(ref)
    model = _model(case, tensors, mesh)
    opt = _candidate(case, model, factory)
    phases.lap("set-up (mesh, fully_shard, optimizers)")
    records: list[Comparison] = []
    for step in range(case.steps):
        for i, spec in enumerate(case.params):
            g = gradient(spec, case.seed, i, step)
            ref_p = ref_by_name[spec.name]
            cand_p = model.get_parameter(spec.name)
            ref_p.grad = None if g is None else g.to(device)
            cand_p.grad = None if g is None else _shard_like(g.to(device), cand_p)
        phases.lap("inputs")
        ref.step()
        phases.lap("reference step")
        opt.step()
        phases.lap("candidate step (with its collectives)")
        if case.checkpoint_after is not None and step + 1 == case.checkpoint_after:
            model, opt = _round_trip(case, model, opt, mesh, factory, ctx)
            phases.lap("checkpoint round trip")
        records += _compare_step(gate, case, step, ctx.rank, ref, ref_by_name, opt, model)
        phases.lap("compare")
    out = [r.to_record() for r in records]
    phases.lap("compare")
    _LAST_PHASES.clear()
    _LAST_PHASES.update(phases.seconds)
    return out


def _compare_step(
    gate: str,
    case: Case,
    step: int,
    rank: int,
    ref: reference.Muon,
    ref_by_name: dict[str, Tensor],
    opt: torch.optim.Optimizer,
    model: nn.Module,
) -> list[Comparison]:
    """Every parameter and every optimizer state tensor both sides have, after one step."""
    records = []
    for spec in case.params:
        ref_p, cand_p = ref_by_name[spec.name], model.get_parameter(spec.name)
        records.append(compare_shard(gate, spec.name, step, rank, ref_p.detach(), cand_p))
        ref_state, cand_state = ref.state.get(ref_p, {}), opt.state.get(cand_p, {})
        for key in STATE_KEYS:
            if key in ref_state and key in cand_state:
                records.append(compare_shard(gate, f"{spec.name}.{key}", step, rank, ref_state[key], cand_state[key]))
    return records


def _shard_like(full: Tensor, p: Tensor) -> Tensor:
    if isinstance(p, DTensor):
        return distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None)
    return full


def compare_shard(
    gate: str, name: str, step: int, rank: int, ref_full: Tensor, cand: Tensor, tier: Tier = BITWISE
) -> Comparison:
    """This rank's shard of ``cand`` against the same rows of the full reference tensor (no collective)."""
    if isinstance(cand, DTensor):
        expected = distribute_tensor(ref_full, cand.device_mesh, cand.placements, src_data_rank=None).to_local()
        actual = cand.to_local()
    else:
        expected, actual = ref_full, cand
    return compare(expected, actual.detach(), gate=gate, tensor=name, step=step, rank=rank, tier=tier)


def _round_trip(
    case: Case,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    mesh: DeviceMesh,
    factory: Callable[..., torch.optim.Optimizer],
    ctx: RankContext,
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Saves model and optimizer with DCP, loads them into a fresh model and optimizer."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    # One directory for the whole case, named by rank 0: ranks of different torchrun nodes
    # have different parents. Across hosts it must be shared storage (MUONGATE_CHECKPOINT_DIR).
    chosen = [
        os.path.join(
            os.environ.get("MUONGATE_CHECKPOINT_DIR", tempfile.gettempdir()), f"muongate-ckpt-{uuid.uuid4().hex}"
        )
    ]
    dist.broadcast_object_list(chosen, src=dist.get_global_rank(ctx.group, 0), group=ctx.group)
    path = chosen[0]
    saved = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
    dcp.save(saved, checkpoint_id=path, process_group=ctx.group)
    zeros = [torch.zeros(s.shape, dtype=getattr(torch, s.dtype), device=ctx.device) for s in case.params]
    fresh = _model(case, zeros, mesh)
    fresh_opt = _candidate(case, fresh, factory)
    state: dict[str, Any] = {"model": get_model_state_dict(fresh), "optim": get_optimizer_state_dict(fresh, fresh_opt)}
    # A parameter that never had a gradient has no optimizer state in the checkpoint, while
    # DCP's state-dict API initializes state for every parameter of the fresh optimizer.
    dcp.load(state, checkpoint_id=path, planner=DefaultLoadPlanner(allow_partial_load=True), process_group=ctx.group)
    set_model_state_dict(fresh, state["model"])
    set_optimizer_state_dict(fresh, fresh_opt, state["optim"])
    dist.barrier(group=ctx.group)
    if ctx.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    return fresh, fresh_opt


def run_orthogonalize_case(ctx: RankContext, payload: tuple[str, Case]) -> list[dict[str, Any]]:
    """Gathers each matrix of the case from its shards, orthogonalizes it the candidate's way
    (``case.mode``), and compares this rank's rows with the reference's full-matrix result."""
    from distributed_impl import placement

    gate, case = payload
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
        exchange = placement.OwnerExchange(bucket_numel=256)
        exchange.run(
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
        expected = distribute_tensor(ns(full), mesh, shard.placements, src_data_rank=None).to_local()
        records.append(compare(expected, mine, gate=gate, tensor=spec.name, rank=ctx.rank))
    return [r.to_record() for r in records]


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


def run_backward_case(ctx: RankContext, payload: tuple[str, Case]) -> list[dict[str, Any]]:
    """FSDP2 forward and backward on per-rank micro-batches; the reference is fed the
    gradients FSDP2 produced (gathered), so the claim is the optimizer after a real backward."""
    gate, case = payload
    device = torch.device(ctx.device)
    d1, d0 = case.params[0].shape
    d2 = case.params[1].shape[0]
    model = nn.Sequential(nn.Linear(d0, d1, bias=False), nn.Tanh(), nn.Linear(d1, d2)).to(device)
    tensors = [initial_param(s, case.seed, i).to(device) for i, s in enumerate(case.params)]
    with torch.no_grad():
        for spec, t in zip(case.params, tensors, strict=True):
            model.get_parameter(spec.name).copy_(t)
    ref = _reference(case, tensors)
    ref_by_name = _by_name(ref)
    mesh = mesh_for(ctx, case.mesh)
    fully_shard(model[0], mesh=mesh)
    fully_shard(model[2], mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = _candidate(case, model, load_object(case.candidate))
    records: list[Comparison] = []
    for step in range(case.steps):
        gen = torch.Generator().manual_seed(case.seed * 7 + step * 131 + ctx.rank)
        x = torch.randn(4, d0, generator=gen).to(device)
        model(x).square().mean().backward()
        for spec in case.params:
            grad = model.get_parameter(spec.name).grad
            ref_by_name[spec.name].grad = grad.full_tensor() if isinstance(grad, DTensor) else grad
        ref.step()
        opt.step()
        opt.zero_grad()
        records += _compare_step(gate, case, step, ctx.rank, ref, ref_by_name, opt, model)
    return [r.to_record() for r in records]


def _by_name(ref: reference.Muon) -> dict[str, Tensor]:
    """The reference's parameters by case name, as its param groups name them."""
    return {name: p for g in ref.param_groups for name, p in zip(g["param_names"], g["params"], strict=True)}
