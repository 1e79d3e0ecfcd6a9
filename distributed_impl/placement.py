"""Where every row of every matrix lives: the only module here that reads a
``DeviceMesh`` or a ``Placement``.

Parameters are DTensors on any mesh, with any placements but ``Partial``: FSDP2's
``(Shard(0),)`` on a 1-D mesh and ``(Replicate(), Shard(0))`` on a 2-D HSDP mesh; tensor
parallel's ``(Shard(0),)`` (colwise) and ``(Shard(1),)`` (rowwise); FSDP2 over TP's
``(_StridedShard(0, sf), Shard(0))`` and ``(Shard(0), Shard(1))``; ``Replicate()``. Shards
follow ``torch.chunk``: with ``n`` rows on ``S`` ranks every shard has ``ceil(n / S)`` rows
except the last non-empty one, and ranks past ``n`` hold 0 rows.

Two ways to get a full matrix to Newton–Schulz and its piece back:

* ``gather_full`` / ``local_rows``: every rank gathers every matrix (DTensor's own
  ``full_tensor``), orthogonalizes it, keeps its piece (DTensor's own ``redistribute``
  from ``Replicate``). Any layout; simple to audit.
* ``distributed_impl.exchange.OwnerExchange``: each matrix has one owner rank; rows
  travel point to point to the owner and back (that module owns who owns what), over the
  mesh's last dim. ``distributed_impl.mesh_split`` brings every other layout to that one
  first (``rows_layout``, by DTensor's own ``redistribute``) and splits the matrices
  between the replicas of the other dims (``replica_index``, ``broadcast_from_replica``);
  3-D expert stacks go to ``experts_layout`` instead, whole experts on every rank.

Both move tensors in the dtype Newton–Schulz runs in, which the reference casts to first
anyway, so the bits are the reference's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement, _StridedShard


def describe(name: str, p: Tensor) -> str:
    """``'name' shape (…) placements (…) on rank r`` for error messages."""
    placements = tuple(p.placements) if isinstance(p, DTensor) else "plain tensor"
    rank = dist.get_rank() if dist.is_initialized() else 0
    return f"parameter {name!r} of shape {tuple(p.shape)} with placements {placements} on rank {rank}"


def check_layout(name: str, p: Tensor, *, matrix: bool) -> None:
    """Raises a ``TypeError``/``ValueError`` naming the parameter unless its layout is supported."""
    if not isinstance(p, DTensor):
        raise TypeError(f"{describe(name, p)}: expected a DTensor from fully_shard or distribute_tensor")
    unsupported = [pl for pl in p.placements if not isinstance(pl, (Shard, _StridedShard, Replicate))]
    if unsupported:
        raise ValueError(
            f"{describe(name, p)}: {unsupported} is not a layout of a parameter; supported are Shard, "
            "_StridedShard and Replicate on any mesh"
        )
    if matrix and p.ndim not in (2, 3):
        raise ValueError(
            f"{describe(name, p)}: Muon takes 2-D matrices or 3-D [experts, rows, cols] stacks; "
            "put it in a group with use_muon=False"
        )


def shard_group(p: DTensor) -> dist.ProcessGroup:
    """The process group the parameter's dim 0 is split over (the last mesh dimension)."""
    mesh: DeviceMesh = p.device_mesh
    return mesh.get_group(mesh.ndim - 1)


def chunk_rows(n: int, shards: int) -> list[int]:
    """Rows on each shard under ``torch.chunk`` semantics (what FSDP2 and ``Shard(0)`` use)."""
    size = math.ceil(n / shards) if n else 0
    return [max(0, min(size, n - i * size)) for i in range(shards)]


def rows_layout(p: DTensor) -> tuple[Placement, ...]:
    """Rows split over ``p``'s mesh's last dim, replicated over the others: the layout the
    owner exchange moves (FSDP2's ``(Shard(0),)``, HSDP's ``(Replicate(), Shard(0))``)."""
    return (*[Replicate()] * (p.device_mesh.ndim - 1), Shard(0))


def experts_layout(p: DTensor) -> tuple[Placement, ...]:
    """A 3-D stack's experts split over every mesh dim: each rank holds whole matrices."""
    return (Shard(0),) * p.device_mesh.ndim


def in_layout(p: DTensor, placements: tuple[Placement, ...]) -> bool:
    return tuple(p.placements) == placements


def relayout(local: Tensor, p: DTensor, placements: tuple[Placement, ...]) -> DTensor:
    """The tensor whose pieces (laid out as ``p``) are ``local`` on every rank, laid out as
    ``placements`` instead: DTensor's own ``redistribute``."""
    dt = DTensor.from_local(local, p.device_mesh, p.placements, shape=p.shape, stride=local_stride(p))
    return dt if in_layout(p, placements) else dt.redistribute(p.device_mesh, placements)


def restore(local: Tensor, p: DTensor, placements: tuple[Placement, ...]) -> Tensor:
    """The inverse of ``relayout``: this rank's pieces in ``placements`` back in ``p``'s layout."""
    if in_layout(p, placements):
        return local
    dt = DTensor.from_local(local, p.device_mesh, placements, shape=p.shape, stride=local_stride(p))
    return dt.redistribute(p.device_mesh, p.placements).to_local()


def empty_rows(p: DTensor, dtype: torch.dtype) -> Tensor:
    """This rank's piece of ``p`` in the rows layout, uninitialized."""
    mesh = p.device_mesh
    rows = chunk_rows(int(p.shape[0]), mesh.shape[-1])[_coordinate(mesh)[-1]]
    return torch.empty(rows, int(p.shape[1]), dtype=dtype, device=p.to_local().device)


def by_mesh(params: Sequence[DTensor]) -> list[list[DTensor]]:
    """The parameters grouped by mesh (equal meshes, not only the same object: FSDP2 over
    TP gives each parameter a mesh of its own), in order of first appearance."""
    groups: dict[DeviceMesh, list[DTensor]] = {}
    for p in params:
        groups.setdefault(p.device_mesh, []).append(p)
    return list(groups.values())


def replicas(p: DTensor) -> int:
    """How many copies of the rows layout ``p``'s mesh holds: the product of all dims but the last."""
    return math.prod(p.device_mesh.shape[:-1])


def replica_index(p: DTensor) -> int:
    """Which copy this rank's rows belong to: its coordinate on all dims but the last, row-major."""
    mesh = p.device_mesh
    index = 0
    for size, c in zip(mesh.shape[:-1], _coordinate(mesh)[:-1], strict=True):
        index = index * size + c
    return index


def broadcast_from_replica(t: Tensor, p: DTensor, replica: int) -> None:
    """Copies ``t`` (this rank's rows of ``p``'s matrix) from the ranks of copy ``replica`` of
    the rows layout to every other copy, in place; each rank receives from the rank of that
    copy that holds the same rows. One broadcast per replicated dim, the last first; a dim's
    group sits out while none of its ranks holds the rows yet."""
    mesh = p.device_mesh
    coordinate = _coordinate(mesh)
    owner: list[int] = []
    for size in reversed(mesh.shape[:-1]):
        owner.insert(0, replica % size)
        replica //= size
    for d in reversed(range(mesh.ndim - 1)):
        if coordinate[:d] != owner[:d]:
            continue
        root = [*coordinate]
        root[d] = owner[d]
        dist.broadcast(t, src=int(mesh.mesh[tuple(root)]), group=mesh.get_group(d))


def _coordinate(mesh: DeviceMesh) -> list[int]:
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise RuntimeError(f"rank {dist.get_rank()} is not in the mesh {mesh}")
    return list(coordinate)


def needs_gather(p: DTensor) -> bool:
    """Whether this rank's piece lacks part of some matrix: not where every placement is
    ``Replicate``, nor for a 3-D expert stack split only on its expert dim (whole matrices)."""
    split = [pl for pl in p.placements if not isinstance(pl, Replicate)]
    if p.ndim == 3:
        return any(pl.dim != 0 for pl in split)  # type: ignore[attr-defined]
    return bool(split)


def gather_full(local: Tensor, p: DTensor) -> Tensor:
    """The full tensor from every rank's shard (DTensor's own all-gather, padding removed)."""
    dt = DTensor.from_local(local, p.device_mesh, p.placements, shape=p.shape, stride=local_stride(p))
    return dt.full_tensor()


def local_rows(full: Tensor, p: DTensor) -> Tensor:
    """This rank's shard of a full tensor every rank holds; no communication."""
    mesh = p.device_mesh
    replicated = DTensor.from_local(full, mesh, [Replicate()] * mesh.ndim, run_check=False)
    return replicated.redistribute(mesh, p.placements).to_local()


def global_rows(p: DTensor) -> list[int]:
    """The row (dim -2) of the whole matrix that each of this rank's rows is, in order: the row
    numbers laid out as ``p`` is (``local_rows``); none where this rank holds no element."""
    rows = p.shape[-2]
    numbers = torch.arange(rows, device=p.to_local().device).view(rows, 1).expand(p.shape).contiguous()
    mine = local_rows(numbers, p)
    if mine.numel() == 0:
        return []
    return cast(list[int], mine[(0,) * (mine.ndim - 2)][:, 0].tolist())


def local_stride(p: DTensor) -> tuple[int, ...]:
    return tuple(p.stride())


def row_spans(rows: int, shards: int) -> list[slice]:
    """Each shard's rows of a ``rows``-row matrix as a slice (``torch.chunk`` layout)."""
    spans, start = [], 0
    for n in chunk_rows(rows, shards):
        spans.append(slice(start, start + n))
        start += n
    return spans
