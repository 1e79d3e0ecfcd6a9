"""The sides of an optimizer case on a rank: the reference on plain copies of the full tensors,
the candidate on the case's layout, and (``--against self``) the candidate's own one-device
twin; and this rank's pieces of each compared with the other."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh

from harness.algorithms import reference_of
from harness.candidates.declaration import declaration_of
from harness.candidates.kernel import orthogonalizer
from harness.cases.case import Case
from harness.ranks import RankContext
from harness.ranks.switches import hold
from harness.tasks.common import (
    candidate_keywords,
    compare_params_and_state,
    declared_causes,
    factory_of,
    param_groups,
)
from harness.tasks.layouts import build_model, case_param
from reports.records import Comparison

#: a candidate and the model it steps
Side = tuple[nn.Module, torch.optim.Optimizer]


def groups_of(case: Case, params: Sequence[Tensor]) -> list[dict[str, Any]]:
    """A hybrid reference's (Muon's) two groups, or one group of every parameter."""
    named = [(s.name, p, s.use_muon) for s, p in zip(case.params, params, strict=True)]
    if reference_of(case).hybrid:
        return param_groups(named)
    return [{"params": [p for _, p, _ in named], "param_names": [n for n, _, _ in named]}]


def kernel_of(case: Case) -> Callable[..., Tensor] | None:
    """The case's ``--kernel`` behind the reference's ``orthogonalize`` signature, if any."""
    return orthogonalizer(case.kernel) if case.kernel else None


def reference_side(case: Case, tensors: list[Tensor]) -> torch.optim.Optimizer | None:
    """The case's reference (``harness.algorithms``) on plain copies of the full tensors; ``None``
    under ``--reference none``, where the candidate's one-device twin is the only other side."""
    if reference_of(case).factory is None:
        return None
    plain: list[Tensor] = [nn.Parameter(t.clone()) for t in tensors]
    kernel = {"orthogonalize_fn": kernel_of(case)} if case.kernel else {}
    return hold(reference_of(case).factory(groups_of(case, plain), **kernel, **case.settings_dict()))


def only_reference(case: Case, tensors: list[Tensor]) -> torch.optim.Optimizer:
    """``reference_side`` for a task that compares with the reference alone (it skips without one)."""
    ref = reference_side(case, tensors)
    if ref is None:
        raise ValueError(f"{case.describe()}: the task compares with a reference; --reference none names none")
    return ref


def by_name(ref: torch.optim.Optimizer | None) -> dict[str, Tensor]:
    """The reference's parameters by case name, as its param groups name them (none without one)."""
    if ref is None:
        return {}
    return {name: p for g in ref.param_groups for name, p in zip(g["param_names"], g["params"], strict=True)}


def candidate_side(case: Case, model: nn.Module, factory: Any = None) -> torch.optim.Optimizer:
    """The case's candidate (or ``factory``) on ``model``'s parameters, with every reference
    setting, defaults included (``candidate_keywords``): a plug-in gets the whole configuration."""
    params = [case_param(model, s.name) for s in case.params]
    kwargs = candidate_keywords(case)
    if case.mode is not None:
        kwargs["mode"] = case.mode
    if case.kernel:
        kwargs["orthogonalize_fn"] = kernel_of(case)
    return (factory or factory_of(case))(groups_of(case, params), **kwargs)


def twin_side(ctx: RankContext, case: Case, build: Callable[[DeviceMesh | None], nn.Module]) -> Side:
    """The candidate as its own single-device self, on the model ``build`` makes: with the
    counterpart it declares (``single_device``) on plain tensors, or else itself on a
    one-rank FSDP2 mesh of this rank alone."""
    single = declaration_of(factory_of(case)).single_device
    if single is not None:
        model = build(None)
        return model, candidate_side(case, model, single)
    model = build(DeviceMesh.from_group(ctx.solo_group, torch.device(ctx.device).type, mesh_dim_names=("shard",)))
    return model, candidate_side(case, model)


def unparallel(case: Case, tensors: list[Tensor]) -> Callable[[DeviceMesh | None], nn.Module]:
    """How the twin builds the case's model: FSDP2 on its one-rank mesh, without the case's TP or EP."""
    return lambda mesh: build_model(case, tensors, mesh, parallel=False)


def starts_of(case: Case, tensors: Sequence[Tensor]) -> dict[str, Tensor] | None:
    """Each parameter's full value before the first step, where the case's candidate declares
    known differences (``Candidate.differences``): its comparisons then say how far the
    reference moved (``Comparison.change_norm``), so that a difference can be set against what
    those causes explain (``harness.verdicts.causes.beyond_causes``). ``None`` otherwise: a figure that
    differs by piece would keep a bitwise comparison's row from being shared in the stream."""
    if not declared_causes(case):
        return None
    return {s.name: t.clone() for s, t in zip(case.params, tensors, strict=True)}


def against_reference(
    case: Case,
    step: int,
    rank: int,
    ref: torch.optim.Optimizer | None,
    opt: torch.optim.Optimizer,
    model: nn.Module,
    starts: Mapping[str, Tensor] | None = None,
) -> list[Comparison]:
    """This rank's pieces against the reference's (none under ``--reference none``); ``starts``:
    each parameter's full value before the first step (``compare_params_and_state``)."""
    if ref is None:
        return []
    ref_by_name = by_name(ref)
    pairs = ((s.name, ref_by_name[s.name], case_param(model, s.name)) for s in case.params)
    return compare_params_and_state(pairs, ref, opt, step=step, rank=rank, keys=reference_of(case).state, starts=starts)


def against_twin(
    case: Case, step: int, rank: int, twin: Side, opt: torch.optim.Optimizer, model: nn.Module
) -> list[Comparison]:
    """This rank's pieces against the candidate's own single-device result (``against="self"``)."""
    twin_model, twin_opt = twin
    pairs = ((s.name, case_param(twin_model, s.name), case_param(model, s.name)) for s in case.params)
    return [
        dataclasses.replace(c, against="self")
        for c in compare_params_and_state(pairs, twin_opt, opt, step=step, rank=rank, keys=reference_of(case).state)
    ]
