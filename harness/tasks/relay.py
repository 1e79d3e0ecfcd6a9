"""Rank-side check of the relay (``harness.ranks.relay``) against plain gloo.

Every collective the gates and the candidates use (c10d's, the functional ones DTensor calls,
the object collectives the distributed checkpoint calls, DTensor's redistributions on 1-D
and 2-D meshes, FSDP2's forward and backward) runs twice on the same inputs: through the
case's group, which is a relay, on the rank's device; and through a plain gloo group of the
same ranks on CPU copies. Each output is compared bitwise. FSDP2 computes as well as
communicates, so both of its sides run on the rank's device.

The pool must be all of the case (``world_size == nproc``): the gloo groups are made here,
and every rank of the pool takes part in making a group.
"""

from __future__ import annotations

import contextlib
import math
import zlib
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor

from harness.ranks import RankContext
from harness.verdicts.compare import compare

Check = Callable[[Any, torch.device, int, int], list[Tensor]]

#: the gloo groups of each pool size, made once (world, then each grid shape's dims)
_GLOO: dict[Any, Any] = {}


def _inputs(name: str, rank: int, *shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Values that differ by rank and by check, with fractions, so a reduction's order shows."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{name} {rank}".encode()))
    return torch.randn(*shape, generator=g).to(dtype)


def _all_reduce(op: str, dtype: torch.dtype = torch.float32) -> Check:
    def run(group: Any, device: torch.device, rank: int, world: int) -> list[Tensor]:
        t = _inputs("all_reduce", rank, 5, 3, dtype=dtype).to(device)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=group)
        return [t]

    return run


def _reduce_scatter_tensor(op: str) -> Check:
    def run(group: Any, device: torch.device, rank: int, world: int) -> list[Tensor]:
        out = torch.empty(3, 2, device=device)
        dist.reduce_scatter_tensor(
            out, _inputs("rs", rank, 3 * world, 2).to(device), op=getattr(dist.ReduceOp, op), group=group
        )
        return [out]

    return run


def _broadcast(group: Any, device: torch.device, rank: int, world: int) -> list[Tensor]:
    t = _inputs("broadcast", rank, 4, 2).to(device)
    dist.broadcast(t, group_src=world - 1, group=group)
    return [t]


def _reduce(group: Any, device: torch.device, rank: int, world: int) -> list[Tensor]:
    t = _inputs("reduce", rank, 7).to(device)
    dist.reduce(t, group_dst=0, group=group)
    return [t] if rank == 0 else []


def _all_gather(group: Any, device: torch.device, rank: int, world: int) -> list[Tensor]:
    outs = [torch.empty(2, 3, device=device) for _ in range(world)]
    dist.all_gather(outs, _inputs("all_gather", rank, 2, 3).to(device), group=group)
    return outs


def _all_gather_into_tensor(group: Any, device: torch.device, rank: int, world: int) -> list[Tensor]:
    out = torch.empty(3 * world, 2, device=device)
    dist.all_gather_into_tensor(out, _inputs("agit", rank, 3, 2).to(device), group=group)
    return [out]


def _gather(group: Any, device: torch.device, rank: int, world: int) -> list[Tensor]:
    outs = [torch.empty(3, device=device) for _ in range(world)] if rank == 0 else None
    dist.gather(_inputs("gather", rank, 3).to(device), outs, group_dst=0, group=group)
    return outs or []


def _scatter(group: Any, device: torch.device, rank: int, world: int) -> list[Tensor]:
    out = torch.empty(4, device=device)
    pieces = [_inputs("scatter", r, 4).to(device) for r in range(world)] if rank == 0 else None
    dist.scatter(out, pieces, group_src=0, group=group)
    return [out]


def _reduce_scatter(group: Any, device: torch.device, rank: int, world: int) -> list[Tensor]:
    out = torch.empty(2, 2, device=device)
    dist.reduce_scatter(out, [_inputs(f"rsl{r}", rank, 2, 2).to(device) for r in range(world)], group=group)
    return [out]


def _all_to_all(group: Any, device: torch.device, rank: int, world: int) -> list[Tensor]:
    # gloo's list form takes pieces of one size (the single-tensor form below takes uneven ones)
    ins = [_inputs(f"a2a{s}", rank, 3, 2).to(device) for s in range(world)]
    outs = [torch.empty(3, 2, device=device) for _ in range(world)]
    dist.all_to_all(outs, ins, group=group)
    return outs


def _all_to_all_single(group: Any, device: torch.device, rank: int, world: int) -> list[Tensor]:
    ins_splits = [rank + s for s in range(world)]
    outs_splits = [s + rank for s in range(world)]
    out = torch.empty(sum(outs_splits), 3, device=device)
    src = _inputs("a2as", rank, sum(ins_splits), 3).to(device)
    dist.all_to_all_single(out, src, outs_splits, ins_splits, group=group)
    return [out]


def _send_recv(group: Any, device: torch.device, rank: int, world: int) -> list[Tensor]:
    """Each rank sends to the next and receives from the one before (even ranks send first)."""
    out = torch.empty(6, device=device)
    mine = _inputs("p2p", rank, 6).to(device)
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    for turn in (0, 1):
        if rank % 2 == turn:
            dist.send(mine, group_dst=nxt, group=group)
        else:
            dist.recv(out, group_src=prev, group=group)
    return [out]


def _objects(group: Any, device: torch.device, rank: int, world: int) -> list[Tensor]:
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "x": _inputs("obj", rank, 3)}, group=group)
    box = [{"x": _inputs("bobj", rank, 2)}]
    dist.broadcast_object_list(box, group_src=0, group=group)
    return [g["x"] for g in gathered] + [box[0]["x"]]


def _functional(group: Any, device: torch.device, rank: int, world: int) -> list[Tensor]:
    import torch.distributed._functional_collectives as funcol

    x = _inputs("funcol", rank, 2 * world, 3).to(device)
    outs = [
        funcol.all_gather_tensor(x, 0, group),
        funcol.all_reduce(x, "sum", group),
        funcol.all_reduce(x, "avg", group),
        funcol.reduce_scatter_tensor(x, "sum", 0, group),
        funcol.all_to_all_single(x, None, None, group),
        *funcol.all_gather_into_tensor_coalesced([x, 2 * x[:1]], group),
        *funcol.reduce_scatter_tensor_coalesced([x, 3 * x], "sum", [0, 0], group),
    ]
    return [funcol.wait_tensor(o) if hasattr(o, "wait") else o for o in outs]


def _coalesced(group: Any, device: torch.device, rank: int, world: int) -> list[Tensor]:
    """All-gathers and reduce-scatters inside ``_coalescing_manager``, as Megatron-core's
    distributed optimizer issues a bucket group's; plain gloo, which cannot coalesce, runs them
    one by one, which is what coalescing means."""
    x = _inputs("coalesced", rank, 2 * world, 3).to(device)
    gathered = [torch.empty(2 * world * world, 3, device=device), torch.empty(world, 3, device=device)]
    scattered = [torch.empty(2, 3, device=device), torch.empty(2, 3, device=device)]

    def coalescing() -> Any:
        if dist.get_backend(group) == "gloo":
            return contextlib.nullcontext()
        return dist._coalescing_manager(group, async_ops=True)

    with coalescing() as handles:
        dist.all_gather_into_tensor(gathered[0], x, group=group)
        dist.all_gather_into_tensor(gathered[1], x[:1], group=group)
    with coalescing() as more:
        dist.reduce_scatter_tensor(scattered[0], x, group=group)
        dist.reduce_scatter_tensor(scattered[1], 3 * x, group=group)
    for waited in (handles, more):
        if waited is not None:
            waited.wait()
    return [*gathered, *scattered]


def _dtensor(group: Any, device: torch.device, rank: int, world: int) -> list[Tensor]:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    mesh = DeviceMesh.from_group(group, device.type)
    whole = _inputs("dtensor", 0, 2 * world + 1, 5).to(device)  # uneven: the last shard is short
    dt = distribute_tensor(whole, mesh, [Shard(0)])
    partial = DTensor.from_local(_inputs("partial", rank, 3, 4).to(device), mesh, [Partial()])
    return [
        dt.full_tensor(),
        dt.redistribute(mesh, [Shard(1)]).to_local(),
        dt.redistribute(mesh, [Shard(1)]).full_tensor(),
        partial.redistribute(mesh, [Replicate()]).to_local(),
        partial.redistribute(mesh, [Shard(0)]).to_local(),
    ]


def _grid(groups: tuple[Any, ...], shape: tuple[int, ...], device: torch.device) -> Any:
    from torch.distributed.device_mesh import DeviceMesh

    ranks = torch.arange(math.prod(shape)).view(shape)
    return DeviceMesh.from_group(
        list(groups), device.type, mesh=ranks, mesh_dim_names=tuple(f"d{i}" for i in range(len(shape)))
    )


def _dtensor_grid(mesh: Any, device: torch.device, rank: int) -> list[Tensor]:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    whole = _inputs("grid", 0, 9, 7).to(device)
    placements = [Shard(0), Shard(1)] + [Replicate()] * (mesh.ndim - 2)
    dt = distribute_tensor(whole, mesh, placements)
    moved = dt.redistribute(mesh, [Replicate(), Shard(0)] + [Shard(1)] * (mesh.ndim - 2))
    return [dt.full_tensor(), moved.to_local(), cast(DTensor, (dt * 3).sum(dim=0)).full_tensor()]


def _fsdp(mesh: Any, device: torch.device, rank: int) -> list[Tensor]:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3)).to(device)
    fully_shard(model, mesh=mesh)
    model(_inputs("fsdp", rank, 4, 5).to(device)).square().sum().backward()
    return [cast(DTensor, p.grad).to_local() for p in model.parameters()]


#: the collectives, each run through both groups of the whole pool
CHECKS: dict[str, Check] = {
    "all_reduce sum": _all_reduce("SUM"),
    "all_reduce avg": _all_reduce("AVG"),
    "all_reduce max": _all_reduce("MAX"),
    "all_reduce sum bf16": _all_reduce("SUM", torch.bfloat16),
    "broadcast": _broadcast,
    "reduce": _reduce,
    "all_gather": _all_gather,
    "all_gather_into_tensor": _all_gather_into_tensor,
    "gather": _gather,
    "scatter": _scatter,
    "reduce_scatter": _reduce_scatter,
    "reduce_scatter_tensor sum": _reduce_scatter_tensor("SUM"),
    "reduce_scatter_tensor avg": _reduce_scatter_tensor("AVG"),
    "all_to_all": _all_to_all,
    "all_to_all_single": _all_to_all_single,
    "send/recv": _send_recv,
    "objects": _objects,
    "functional": _functional,
    "coalesced": _coalesced,
    "DTensor 1-D": _dtensor,
}


def _gloo_groups(ctx: RankContext) -> tuple[Any, dict[tuple[int, ...], tuple[Any, ...]]]:
    """A plain gloo group of the pool, and gloo groups laid as the pool's grids (made once)."""
    if ctx.world_size not in _GLOO:
        from harness.ranks.context import make_groups

        made = make_groups(ctx.world_size, backend="gloo")
        _GLOO[ctx.world_size] = (made.worlds[ctx.world_size], made.grids)
    return _GLOO[ctx.world_size]


def against_gloo(ctx: RankContext, names: list[str] | None) -> dict[str, str | None]:
    """Each check of ``names`` (all where ``None``), and FSDP2 and DTensor on each grid: ``""``
    where every output of the relay equals plain gloo's bit for bit, ``None`` where plain gloo
    does not have the collective, else what differed."""
    if dist.get_world_size() != ctx.world_size:
        raise ValueError(f"the relay check needs the whole pool: world {ctx.world_size} of {dist.get_world_size()}")
    device = torch.device(ctx.device)
    gloo, grids = _gloo_groups(ctx)
    found: dict[str, str | None] = {}

    def judge(name: str, relayed: list[Tensor], plain: list[Tensor]) -> None:
        if len(relayed) != len(plain):
            found[name] = f"{len(relayed)} outputs, gloo's {len(plain)}"
            return
        bad = [
            f"output {i}: {c.mismatches} of {c.shape} differ (max|diff| {c.max_abs_diff:.3g})"
            for i, (r, p) in enumerate(zip(relayed, plain, strict=True))
            if not (c := compare(p, r, tensor=f"{name} {i}")).bitwise
        ]
        found[name] = "; ".join(bad)

    for name, check in CHECKS.items():
        if names is None or name in names:
            # gloo's side first: where this torch's gloo lacks the collective (torch 2.11 has no
            # list all_to_all) every rank raises before sending anything, and the relay, which
            # runs it on gloo, can do no better: not checked, and said.
            try:
                plain = check(gloo, torch.device("cpu"), ctx.rank, ctx.world_size)
            except RuntimeError as e:
                if "does not support" not in str(e):
                    raise
                found[name] = None
                continue
            judge(name, check(ctx.group, device, ctx.rank, ctx.world_size), plain)
    if names is None or "FSDP2" in names:
        from torch.distributed.device_mesh import DeviceMesh

        judge(
            "FSDP2",
            _fsdp(DeviceMesh.from_group(ctx.group, device.type), device, ctx.rank),
            _fsdp(DeviceMesh.from_group(gloo, device.type), device, ctx.rank),
        )
    for shape, dims in ctx.grid_groups.items():
        if names is None or "grids" in names:
            judge(
                f"DTensor {shape}",
                _dtensor_grid(_grid(dims, shape, device), device, ctx.rank),
                _dtensor_grid(_grid(grids[shape], shape, torch.device("cpu")), torch.device("cpu"), ctx.rank),
            )
            if len(shape) == 2:
                judge(
                    f"HSDP {shape}",
                    _fsdp(_grid(dims, shape, device), device, ctx.rank),
                    _fsdp(_grid(grids[shape], shape, device), device, ctx.rank),
                )
    return found
