"""Where every row of every matrix lives: the only module here that reads a
``DeviceMesh`` or a ``Placement``.

Parameters come from FSDP2 (``fully_shard``) as DTensors sharded on dim 0 over the last
mesh dimension: ``(Shard(0),)`` on a 1-D mesh, ``(Replicate(), Shard(0))`` on a 2-D HSDP
mesh. Shards follow ``torch.chunk``: with ``n`` rows on ``S`` ranks every shard has
``ceil(n / S)`` rows except the last non-empty one, and ranks past ``n`` hold 0 rows.

Two ways to get a full matrix to Newton–Schulz and its rows back:

* ``gather_full`` / ``local_rows``: every rank gathers every matrix (DTensor's own
  ``full_tensor``), orthogonalizes it, keeps its rows. Simple to audit.
* ``distributed_impl.exchange.OwnerExchange``: each matrix has one owner rank; rows
  travel point to point to the owner and back (that module owns who owns what).

Both move tensors in the dtype Newton–Schulz runs in, which the reference casts to first
anyway, so the bits are the reference's.
"""

from __future__ import annotations

import math

import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard


def describe(name: str, p: Tensor) -> str:
    """``'name' shape (…) placements (…) on rank r`` for error messages."""
    placements = tuple(p.placements) if isinstance(p, DTensor) else "plain tensor"
    rank = dist.get_rank() if dist.is_initialized() else 0
    return f"parameter {name!r} of shape {tuple(p.shape)} with placements {placements} on rank {rank}"


def check_layout(name: str, p: Tensor, *, matrix: bool) -> None:
    """Raises a ``TypeError``/``ValueError`` naming the parameter unless its layout is supported."""
    if not isinstance(p, DTensor):
        raise TypeError(f"{describe(name, p)}: expected a DTensor from fully_shard or distribute_tensor")
    mesh = p.device_mesh
    placements = tuple(p.placements)
    ok = (mesh.ndim == 1 and placements == (Shard(0),)) or (mesh.ndim == 2 and placements == (Replicate(), Shard(0)))
    if not ok:
        raise ValueError(
            f"{describe(name, p)}: supported layouts are (Shard(0),) on a 1-D mesh and "
            "(Replicate(), Shard(0)) on a 2-D HSDP mesh"
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


def needs_gather(p: DTensor) -> bool:
    """A 3-D expert stack sharded on the expert dim holds whole matrices: no gather needed."""
    return p.ndim == 2


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
