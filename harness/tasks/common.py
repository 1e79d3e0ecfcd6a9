"""What every rank task shares: meshes over the pool's groups, the candidate's factory, param
groups, and comparing a sharded result with the full reference through DTensor itself."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, distribute_tensor

from harness.algorithms import reference_of
from harness.candidates.declaration import declaration_of
from harness.cases.case import optimizer_settings
from harness.layouts import Layout, fully_sharded
from harness.ranks import RankContext
from harness.verdicts.compare import BITWISE, Tier, compare
from reports.records import Comparison

Factory = Callable[..., torch.optim.Optimizer]


def factory_of(held: Any) -> Factory:
    """The candidate factory of a case or a training spec: its ``candidate``, or where it names
    none, the one muongate ships for its reference's family (``harness.algorithms.built_in``)."""
    if held.candidate is not None:
        return held.candidate  # type: ignore[no-any-return]
    from harness.algorithms import built_in_factory

    return built_in_factory(reference_of(held))  # type: ignore[no-any-return]


def declared_causes(held: Any) -> frozenset[str]:
    """The causes of difference its candidate declares (``Candidate.differences``): the session's
    ``--impl``, a gate's own (torch's AdamW in the AdamW gate) or a planted control's."""
    return frozenset(declaration_of(factory_of(held)).differences)


def candidate_keywords(held: Any) -> dict[str, Any]:
    """Every keyword a candidate factory is called with, in every task: each of the reference's
    ``DEFAULTS`` (``harness.algorithms``), overridden by ``held.settings`` (a ``Case``'s or a
    training spec's drawn and declared settings, ``ns_dtype`` as a ``torch.dtype``). The one
    place they are made, so that no gate hands a candidate written to the contract ("every
    keyword of the reference") fewer. ``use_muon`` is left out: it is each param group's own
    key, which the groups carry, not a setting of the optimizer."""
    settings = {**reference_of(held).defaults, **optimizer_settings(held.settings)}
    return {k: v for k, v in settings.items() if k != "use_muon"}


def mesh_for(
    ctx: RankContext, mesh: tuple[int, ...], *, layout: Layout | None = None, names: tuple[str, ...] | None = None
) -> DeviceMesh:
    """A mesh over the pool's groups made for it at start-up (no group is made here), its
    dims named ``names``, or as the case's layout family names them (``Layout.dims``; ``None``:
    FSDP2's own, ``fully_shard`` on 1-D, HSDP on 2-D). A 1-D mesh of fewer ranks than the
    case's spans ranks ``0 .. n-1``."""
    device_type = torch.device(ctx.device).type
    names = names or (layout or fully_sharded(len(mesh))).dims
    if len(mesh) == 1:
        group = ctx.group if mesh[0] == ctx.world_size else ctx.world_groups[mesh[0]]
        return DeviceMesh.from_group(group, device_type, mesh_dim_names=names)
    if mesh not in ctx.grid_groups:
        raise ValueError(f"no groups for mesh {mesh}: multi-dim meshes are {sorted(ctx.grid_groups)}")
    ranks = torch.arange(math.prod(mesh)).view(*mesh)
    return DeviceMesh.from_group(list(ctx.grid_groups[mesh]), device_type, mesh=ranks, mesh_dim_names=names)


def param_groups(named: Iterable[tuple[str, Tensor, bool]]) -> list[dict[str, Any]]:
    """``(name, parameter, use_muon)`` triples as a Muon group and an AdamW group (empty ones left out)."""
    muon: list[tuple[str, Tensor]] = []
    other: list[tuple[str, Tensor]] = []
    for name, p, use_muon in named:
        (muon if use_muon else other).append((name, p))
    return [
        {"params": [p for _, p in ps], "param_names": [n for n, _ in ps], "use_muon": use_muon}
        for use_muon, ps in ((True, muon), (False, other))
        if ps
    ]


#: the attribute a plain parameter of a candidate's own sharding carries: the slices of the
#: full tensor it holds (its declared ``piece``, set by ``read_own_sharding``)
PIECE = "muongate_index"


def shard_like(full: Tensor, p: Tensor) -> Tensor:
    """``full`` laid out as ``p`` is (DTensor's own scatter; no communication); a plain piece
    of a candidate's own sharding takes the slices it holds."""
    if isinstance(p, DTensor):
        return distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None)
    index = getattr(p, PIECE, None)
    return full if index is None else full[index].clone()


def local_of(p: Tensor) -> Tensor:
    """This rank's piece of ``p``: a DTensor's local tensor, or the plain tensor itself."""
    return p.to_local() if isinstance(p, DTensor) else p


def local_piece(full: Tensor, p: Tensor) -> Tensor:
    """This rank's piece of ``full`` laid out as ``p`` is (``shard_like``'s local tensor); a plain ``p`` takes it whole."""
    return local_of(shard_like(full, p))


def whole_of_piece(piece: Tensor, p: Tensor, shape: Sequence[int], group: Any) -> Tensor:
    """The full ``shape`` tensor whose piece on this rank is ``piece``, laid out as parameter
    ``p`` is (every rank joins): ``DTensor.from_local`` and ``full_tensor``, or ``whole``."""
    if isinstance(p, DTensor):
        return DTensor.from_local(piece, p.device_mesh, p.placements, shape=p.shape, stride=p.stride()).full_tensor()
    if hasattr(p, PIECE):
        setattr(piece, PIECE, getattr(p, PIECE))
    return whole(piece, shape, group)


def read_own_sharding(named: Iterable[tuple[str, Tensor, torch.Size]], factory: Any, rank: int) -> None:
    """After a candidate's declared ``shard``: each plain parameter's piece, by its declared ``piece``
    (``(name, parameter, full shape)`` triples), checked against the parameter's shape."""
    from harness.candidates.declaration import declaration_of

    reader = declaration_of(factory).piece
    for name, p, full in named:
        if isinstance(p, DTensor) or (reader is None and tuple(p.shape) == tuple(full)):
            continue  # read through its placements, or a whole copy
        if reader is None:
            raise TypeError(
                f"the candidate's shard left parameter {name!r} a plain {list(p.shape)} piece of {list(full)} on rank "
                f"{rank}, and it declares no piece(name, param) to say which piece it is"
            )
        index = tuple(reader(name, p))
        held = torch.empty(full, device="meta")[index].shape
        if held != p.shape:
            raise ValueError(
                f"piece({name!r}) on rank {rank} names slices {index} of {list(full)}, which hold "
                f"{list(held)}, but the parameter is {list(p.shape)}"
            )
        setattr(p, PIECE, index)


def whole(p: Tensor, shape: Sequence[int], group: Any) -> Tensor:
    """All of ``p`` on every rank of ``group``: DTensor's ``full_tensor``, or the plain pieces
    of a candidate's own sharding put in their slices (``all_gather_object``; every rank joins)."""
    if isinstance(p, DTensor):
        return cast(DTensor, p.detach()).full_tensor()
    index = getattr(p, PIECE, None)
    if index is None:
        return p.detach()
    pieces: list[Any] = [None] * torch.distributed.get_world_size(group)
    torch.distributed.all_gather_object(pieces, (index, p.detach().cpu()), group=group)
    full = torch.zeros(tuple(shape), dtype=p.dtype)
    for held, piece in pieces:
        full[held] = piece
    return full.to(p.device)


def compare_shard(
    name: str,
    step: int,
    rank: int,
    ref_full: Tensor,
    cand: Tensor,
    tier: Tier = BITWISE,
    like: Tensor | None = None,
    start: Tensor | None = None,
) -> Comparison:
    """This rank's piece of ``cand`` against the same piece of the full reference tensor, laid
    out by DTensor itself (no offsets computed here, no collective), or as ``like`` (the
    parameter, whose detached copies and state lose its piece) is when ``cand`` is a plain
    piece of a candidate's own sharding. A reference that
    is itself a DTensor on a one-rank mesh (the candidate's single-device self) is read whole.
    ``start``: the full tensor before the first step (a 0-d zero: a state), for ``change_norm``."""
    if isinstance(ref_full, DTensor):
        ref_full = ref_full.full_tensor()
    actual = local_of(cand)
    layout = cand if like is None or isinstance(cand, DTensor) else like
    if start is not None and start.dim():
        start = local_piece(start, layout)
    return compare(
        local_piece(ref_full, layout), actual.detach(), tensor=name, step=step, rank=rank, tier=tier, start=start
    )


def plain_state(value: Tensor) -> Tensor:
    """A quantized optimizer state (a tensor subclass with ``dequantize``, as torchao's low-bit
    states are) as the float tensor it stands for; inside a DTensor, its local piece dequantized,
    so that it is compared with its layout like any other state."""

    def quantized(t: Tensor) -> bool:
        return type(t) not in (Tensor, nn.Parameter, DTensor) and callable(getattr(t, "dequantize", None))

    if isinstance(value, DTensor) and quantized(value.to_local()):
        local = value.to_local().dequantize()
        return DTensor.from_local(local, value.device_mesh, value.placements, shape=value.shape, stride=value.stride())
    return value.dequantize() if quantized(value) else value


def compare_params_and_state(
    pairs: Iterable[tuple[str, Tensor, Tensor]],
    ref_opt: torch.optim.Optimizer,
    opt: torch.optim.Optimizer,
    *,
    step: int,
    rank: int,
    keys: Sequence[str] | None,
    tier: Tier = BITWISE,
    starts: Mapping[str, Tensor] | None = None,
) -> list[Comparison]:
    """For each ``(name, reference parameter, candidate parameter)``: the parameter, then each
    state tensor of ``keys`` (the reference's ``STATE``; ``None``: every one) that both
    optimizers hold for it. A
    state of the parameter's shape is compared piece by piece; any other (a 0-d step count)
    whole, as this rank holds it. ``starts``: each parameter's full value before the first
    step, so that its comparisons say how far the reference moved it (states start at zero)."""
    out = []
    for name, ref_p, p in pairs:
        start = None if starts is None else starts[name]
        out.append(compare_shard(name, step, rank, ref_p.detach(), p.detach(), tier, like=p, start=start))
        ref_state, state = ref_opt.state.get(ref_p, {}), opt.state.get(p, {})
        for key in sorted(set(ref_state) & set(state)) if keys is None else keys:
            ref_value, value = ref_state.get(key), state.get(key)
            if not (isinstance(ref_value, Tensor) and isinstance(value, Tensor)):
                continue
            ref_value, value = plain_state(ref_value), plain_state(value)
            if ref_value.shape == ref_p.shape:
                zero = None if start is None else torch.zeros(())
                out.append(compare_shard(f"{name}.{key}", step, rank, ref_value, value, tier, like=p, start=zero))
            else:
                whole_value = value.full_tensor() if isinstance(value, DTensor) else value
                out.append(
                    compare(ref_value, whole_value.detach(), tensor=f"{name}.{key}", step=step, rank=rank, tier=tier)
                )
    return out
