"""Rank tasks for Muon's own claims (they skip for other algorithms): the update held to a
calibrated tier, the spectrum of the orthogonalization against an exact polar factor, and
muongate's own gather–orthogonalize–scatter against the reference's rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import reference
from harness.cases.case import Case
from harness.cases.tensors import generator, gradient, initial_param, spectrum_matrix
from harness.ranks import RankContext
from harness.tasks.common import local_of, local_piece, mesh_for, shard_like, whole, whole_of_piece
from harness.tasks.layouts import build_model, case_param
from harness.tasks.result import TaskResult
from harness.tasks.sides import by_name, candidate_side, kernel_of, only_reference
from harness.verdicts.compare import compare


@dataclass
class _Sides:
    """The reference on the case's whole weights and the candidate on the case's layout, with
    the parameters by name: what the update and cause tasks both step."""

    tensors: list[Tensor]
    ref: torch.optim.Optimizer
    ref_by_name: dict[str, Tensor]
    mesh: DeviceMesh
    opt: torch.optim.Optimizer
    params: dict[str, Tensor]

    @classmethod
    def of(cls, ctx: RankContext, case: Case) -> _Sides:
        device = torch.device(ctx.device)
        tensors = [initial_param(s, case.seed, i).to(device) for i, s in enumerate(case.params)]
        ref = only_reference(case, tensors)
        mesh = mesh_for(ctx, case.mesh, layout=case.layout)
        model = build_model(case, tensors, mesh)
        opt = candidate_side(case, model)
        params = {s.name: case_param(model, s.name) for s in case.params}
        return cls(tensors, ref, by_name(ref), mesh, opt, params)

    def step(self, case: Case, step: int) -> None:
        """Both sides' step ``step``, each parameter given the case's gradient (the candidate its piece)."""
        for i, spec in enumerate(case.params):
            g = cast(Tensor, gradient(spec, case.seed, i, step)).to(self.tensors[i].device)
            self.ref_by_name[spec.name].grad = g
            self.params[spec.name].grad = shard_like(g, self.params[spec.name])
        self.ref.step()
        self.opt.step()


def run_update_case(ctx: RankContext, case: Case) -> TaskResult:
    """One step from the case's weights; the update the candidate applied (new minus old
    weights, float32), gathered whole (DTensor's ``full_tensor``, or a candidate's own pieces
    put together: ``whole_of_piece``), against the
    reference's, in the case's tier, or else ``harness.verdicts.compare.GRAM_PARTIAL`` for its Newton–Schulz
    dtype (judged on rank 0: the tiers were calibrated on whole matrices, and a small piece's
    relative error is larger). With no weight decay the update is ``-lr·scale·O``, so the
    tier judges the orthogonalization itself."""
    from harness.verdicts.compare import GRAM_PARTIAL

    sides = _Sides.of(ctx, case)
    tensors, ref_by_name, mesh, params = sides.tensors, sides.ref_by_name, sides.mesh, sides.params
    before = {name: local_of(p).float().clone() for name, p in params.items()}
    sides.step(case, 0)
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


def run_cause_case(ctx: RankContext, case: Case) -> TaskResult:
    """``case.steps`` steps of the candidate and the reference from the case's weights; after
    each, rank 0 judges every parameter's change since the start (float32, gathered whole with
    DTensor's ``full_tensor`` or ``whole``) and its momentum buffer, where the candidate keeps
    one, each in the case's tier for that tensor and step (``harness.verdicts.causes.cause_tiers``:
    ``case.tier[(kind, step)]``). Every rank joins each gather."""
    sides = _Sides.of(ctx, case)
    tensors, ref, ref_by_name, opt, params = sides.tensors, sides.ref, sides.ref_by_name, sides.opt, sides.params
    group = sides.mesh.get_group() if sides.mesh.ndim == 1 else None
    records = []
    for step in range(case.steps):
        sides.step(case, step)
        for t, spec in zip(tensors, case.params, strict=True):
            p = params[spec.name]
            moved = whole_of_piece(local_of(p).float(), p, spec.shape, group) - t.float()
            buffer = opt.state.get(p, {}).get("momentum_buffer")
            kept = None if buffer is None else whole_of_piece(local_of(buffer).float(), p, spec.shape, group)
            if ctx.rank != 0:
                continue
            ref_p = ref_by_name[spec.name]
            expected = ref_p.detach().float() - t.float()
            records.append(
                compare(expected, moved, tensor=f"{spec.name}.update", step=step, tier=case.tier[("update", step)])
            )
            if kept is not None:
                tier = case.tier[("momentum_buffer", step)]
                reference_buffer = ref.state[ref_p]["momentum_buffer"].float()
                records.append(
                    compare(reference_buffer, kept, tensor=f"{spec.name}.momentum_buffer", step=step, tier=tier)
                )
    return TaskResult(tuple(records))


def run_orthogonalize_case(ctx: RankContext, case: Case) -> TaskResult:
    """Gathers each matrix of the case from its shards, orthogonalizes it ``ShardedMuon``'s way
    (``case.mode``), and compares this rank's rows with the reference's full-matrix result.
    This judges muongate's own placement and exchange code, not a candidate."""
    from distributed_impl import placement
    from distributed_impl.exchange import OwnerExchange

    device = torch.device(ctx.device)
    settings = {**reference.MUON_DEFAULTS, **case.settings_dict()}
    ns = reference.group_orthogonalizer(settings, kernel_of(case))

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
    opt = candidate_side(case, model)
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
