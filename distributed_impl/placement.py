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
  travel point to point to the owner and back (that module owns who owns what). Only
  for the row layouts (``exchangeable``).

Both move tensors in the dtype Newton–Schulz runs in, which the reference casts to first
anyway, so the bits are the reference's.
"""

from __future__ import annotations

import math

import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard


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


def exchangeable(p: DTensor) -> bool:
    """A row layout the owner exchange moves: ``(Shard(0),)`` or ``(Replicate(), Shard(0))``."""
    placements = tuple(p.placements)
    return placements == (Shard(0),) or placements == (Replicate(), Shard(0))


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


def local_stride(p: DTensor) -> tuple[int, ...]:
    return tuple(p.stride())


def row_spans(rows: int, shards: int) -> list[slice]:
    """Each shard's rows of a ``rows``-row matrix as a slice (``torch.chunk`` layout)."""
    spans, start = [], 0
    for n in chunk_rows(rows, shards):
        spans.append(slice(start, start + n))
        start += n
    return spans
