"""A case's parameters laid out as users lay them out: ``fully_shard`` on a 1-D mesh or HSDP,
``parallelize_module`` then ``fully_shard`` for tensor parallelism, ``distribute_tensor`` for
expert parallelism, or the candidate's own ``shard`` function. The layout is the case's data
(``Case.mesh``, ``tp``, ``ep``, each matrix's ``style``); no rank works out an offset by hand."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from harness.candidates.declaration import declaration_of
from harness.cases.case import Case
from harness.layouts import EP_EFSDP, EXPERTS, FSDP, FSDP_TP, HSDP, HSDP_TP, OWN, TP, fully_sharded
from harness.tasks.common import read_own_sharding


class CaseModule(nn.Module):
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
    """A case parameter of a model the task built (``CaseModule``) or of the backward MLP."""
    return model.param(name) if isinstance(model, CaseModule) else model.get_parameter(name)


def zeros_of(case: Case, device: str | torch.device) -> list[Tensor]:
    """Zero tensors of the case's parameters' shapes and dtypes (a fresh model to load into)."""
    return [torch.zeros(s.shape, dtype=getattr(torch, s.dtype), device=device) for s in case.params]


def build_model(
    case: Case, tensors: list[Tensor], mesh: DeviceMesh | None, *, parallel: bool = True, linears: bool = False
) -> nn.Module:
    """The case's parameters in a module laid out as users lay them out, by the builder of its
    layout family (``harness.layouts``): ``fully_shard`` on ``mesh`` (``None``: left plain);
    with ``case.tp > 1``, ``parallelize_module`` on the ``tp`` dim by each matrix's style, then
    ``fully_shard`` on ``dp`` (or HSDP on ``(rep, dp)``) where there is one; with
    ``case.ep > 1``, expert parallelism. Without ``parallel``, FSDP2 alone on ``mesh``. A
    candidate that declares a ``shard`` of its own lays itself out on any mesh.
    ``linears``: matrices as ``nn.Linear`` weights in every layout, so that their names
    (``w0.weight``) are the same on every layout (what a checkpoint resharded across them needs)."""
    named = {s.name: t for s, t in zip(case.params, tensors, strict=True)}
    if mesh is None:
        return CaseModule(named, linears=linears)
    # the rank runs the candidate's own builder wherever it has one, as it always has: the
    # case's ``own`` (set by the runner's adaptation) names the family in records only
    if declaration_of(case.candidate).shard is not None:
        layout = OWN
    elif parallel:
        layout = case.layout
    else:
        layout = fully_sharded(mesh.ndim)
    return BUILDERS[layout.name](case, named, mesh, linears=linears)


def data_parallel(case: Case, named: dict[str, Tensor], mesh: DeviceMesh, *, linears: bool = False) -> nn.Module:
    """FSDP2's own layouts: ``fully_shard`` on a 1-D mesh, HSDP on ``(replicate, shard)``."""
    model = CaseModule(named, linears=linears)
    fully_shard(model, mesh=mesh)
    return model


def own_sharding(case: Case, named: dict[str, Tensor], mesh: DeviceMesh, *, linears: bool = False) -> nn.Module:
    """The candidate's own declared ``shard`` on ``mesh``, then each plain piece read by its ``piece``."""
    model = CaseModule(named, linears=linears)
    own = declaration_of(case.candidate).shard
    assert own is not None, f"{case.candidate} declares no shard of its own"
    own(model, mesh)
    read_own_sharding(((n, model.param(n), t.shape) for n, t in named.items()), case.candidate, mesh.get_rank())
    return model


def tensor_parallel(case: Case, named: dict[str, Tensor], mesh: DeviceMesh, *, linears: bool = True) -> nn.Module:
    """Each matrix an ``nn.Linear``, ``parallelize_module`` on ``tp`` by its style (the others
    replicated, as ``parallelize_module`` leaves what it does not shard), then ``fully_shard``
    on ``dp`` (or HSDP on ``(rep, dp)``) where the mesh has more dims. Matrices are always
    ``nn.Linear`` weights here (``linears`` changes nothing)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    model = CaseModule(named, linears=True)
    tp_mesh = mesh["tp"] if mesh.ndim > 1 else mesh
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = {s.name: styles[s.style]() for s in case.params if s.style in styles and s.name in model.paths}
    parallelize_module(model, tp_mesh, plan)
    for s in case.params:
        if s.name not in plan:
            owner = model.get_submodule(s.name) if s.name in model.paths else model
            leaf = "weight" if s.name in model.paths else s.name
            t = getattr(owner, leaf)
            owner.register_parameter(leaf, nn.Parameter(distribute_tensor(t.detach(), tp_mesh, [Replicate()])))
    if mesh.ndim > 1:
        fully_shard(model, mesh=mesh["dp"] if mesh.ndim == 2 else mesh["rep", "dp"])
    return model


def expert_parallel(case: Case, named: dict[str, Tensor], mesh: DeviceMesh, *, linears: bool = False) -> nn.Module:
    """Expert parallelism on ``(ep, efsdp)``: each 3-D stack's experts split over ``ep`` and its
    rows over ``efsdp`` (``distribute_tensor``, as an expert-parallel plan leaves them);
    every other parameter HSDP-like, replicated over ``ep`` and sharded over ``efsdp``
    (parameters of their own: ``linears`` changes nothing)."""
    model = CaseModule(named)
    for name, t in named.items():
        placements = [Shard(0), Shard(1)] if t.ndim == 3 else [Replicate(), Shard(0)]
        model.register_parameter(name, nn.Parameter(distribute_tensor(t, mesh, placements, src_data_rank=None)))
    return model


#: how a rank lays out each layout family (``harness.layouts``), by its name: ``(case, named
#: tensors, mesh, *, linears) -> nn.Module``; a test holds it to every family there
BUILDERS: dict[str, Callable[..., nn.Module]] = {
    FSDP.name: data_parallel,
    EXPERTS.name: data_parallel,
    HSDP.name: data_parallel,
    OWN.name: own_sharding,
    TP.name: tensor_parallel,
    FSDP_TP.name: tensor_parallel,
    HSDP_TP.name: tensor_parallel,
    EP_EFSDP.name: expert_parallel,
}
