"""What a rank does with a ``ReshardCase``: a checkpoint saved on one layout and world size,
loaded on another, with the values compared against the reference at every step."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from harness.algorithms import reference_of
from harness.cases.case import Case, ReshardCase
from harness.cases.tensors import gradient, initial_param
from harness.ranks import RankContext
from harness.tasks.checkpoint import checkpoint_dir, dcp_load, dcp_save, params_bytes, remove_checkpoint
from harness.tasks.common import compare_params_and_state, mesh_for, shard_like
from harness.tasks.layouts import build_model, case_param, zeros_of
from harness.tasks.result import TaskResult
from harness.tasks.sides import Side, by_name, candidate_side, only_reference
from reports.records import Comparison


def run_reshard_case(ctx: RankContext, rc: ReshardCase) -> TaskResult:
    """The first ``rc.at`` steps on ``rc.before``'s layout, saved with DCP by its ranks; a fresh
    model and optimizer on ``rc.after``'s layout load it and run the rest. Every rank runs the
    reference through every step; each phase's ranks compare their pieces with it."""
    device = torch.device(ctx.device)
    case = rc.after
    tensors = [initial_param(s, case.seed, i).to(device) for i, s in enumerate(case.params)]
    ref = only_reference(case, tensors)
    ref_by_name = by_name(ref)
    path = checkpoint_dir(ctx, params_bytes(tensors))

    def on(side: Case, start: list[Tensor]) -> Side | None:
        if ctx.rank >= side.world_size:
            return None
        model = build_model(side, start, mesh_for(ctx, side.mesh, layout=side.layout), linears=True)
        return model, candidate_side(side, model)

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
            running = on(rc.after, zeros_of(case, device))
            if running is not None:
                dcp_load(*running, path, group(rc.after))
    if running is not None:
        # Only the ranks that loaded it wait to remove it: a rank the new layout left out does
        # not wait on one that raised while loading, and the case ends with every rank returned.
        remove_checkpoint(ctx, path, group(rc.after))
    return TaskResult(tuple(records))
