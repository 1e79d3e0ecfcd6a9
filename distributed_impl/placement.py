"""Where every row of every matrix lives, and how rows travel. The only module here that
touches ``DeviceMesh``, ``Placement`` or a collective.

Parameters come from FSDP2 (``fully_shard``) as DTensors sharded on dim 0 over the last
mesh dimension: ``(Shard(0),)`` on a 1-D mesh, ``(Replicate(), Shard(0))`` on a 2-D HSDP
mesh. Shards follow ``torch.chunk``: with ``n`` rows on ``S`` ranks every shard has
``ceil(n / S)`` rows except the last non-empty one, and ranks past ``n`` hold 0 rows.

Two ways to get a full matrix to Newton–Schulz and its rows back:

* ``gather_full`` / ``local_rows``: every rank gathers every matrix (DTensor's own
  ``full_tensor``), orthogonalizes it, keeps its rows. Simple to audit.
* ``OwnerExchange``: each matrix has one owner rank (balanced by Newton–Schulz cost); one
  ``all_to_all`` sends every shard to its owner, the owner orthogonalizes, a second
  ``all_to_all`` sends the rows back. Each rank does 1/S of the matrix work.

Both move tensors in the dtype Newton–Schulz runs in, which the reference casts to first
anyway, so the bits are the reference's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
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


@dataclass(frozen=True)
class _Item:
    index: int
    rows: int
    cols: int
    owner: int


def assign_owners(shapes: Sequence[tuple[int, int]], shards: int) -> list[int]:
    """Greedy longest-processing-time assignment of matrices to ranks by Newton–Schulz cost.

    The cost of one matrix is ``rows·cols·min(rows, cols)`` (the Gram products dominate).
    Ties go to the lowest rank, so every rank computes the same assignment.
    """
    load = [0] * shards
    owners = [0] * len(shapes)
    order = sorted(range(len(shapes)), key=lambda i: (-_cost(shapes[i]), i))
    for i in order:
        owner = min(range(shards), key=lambda r: (load[r], r))
        owners[i] = owner
        load[owner] += _cost(shapes[i])
    return owners


def _cost(shape: tuple[int, int]) -> int:
    rows, cols = shape
    return rows * cols * min(rows, cols)


def plan_buckets(shapes: Sequence[tuple[int, int]], shards: int, bucket_numel: int) -> list[list[_Item]]:
    """Buckets of matrices, largest first, each at most ``bucket_numel · shards`` elements
    (or one matrix), with owners balanced *within* each bucket.

    Every bucket ends in an exchange all ranks wait for, so a bucket's time is its
    busiest owner's: balancing each bucket, not only the total, is what halves the time.
    """
    order = sorted(range(len(shapes)), key=lambda i: (-_cost(shapes[i]), i))
    buckets: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i in order:
        numel = shapes[i][0] * shapes[i][1]
        if current and used + numel > bucket_numel * shards:
            buckets.append(current)
            current, used = [], 0
        current.append(i)
        used += numel
    if current:
        buckets.append(current)
    planned = []
    for bucket in buckets:
        owners = assign_owners([shapes[i] for i in bucket], shards)
        planned.append([_Item(i, shapes[i][0], shapes[i][1], o) for i, o in zip(bucket, owners, strict=True)])
    return planned


class _Exchange:
    """One bucket's all-to-all in flight, and how to read what it brings."""

    def __init__(self, work: Any, received: Tensor) -> None:
        self.work = work
        self.received = received

    def wait(self) -> Tensor:
        self.work.wait()
        return self.received


class OwnerExchange:
    """Orthogonalizes a list of sharded matrices, each on one owner rank, bucket by bucket.

    ``run(updates, params, fn)`` takes each matrix's local update shard and returns this
    rank's rows of ``fn(full_matrix)``. The next bucket's shards travel while this
    bucket's matrices are orthogonalized, and results travel back while later buckets
    compute. Extra memory per rank is about two buckets of ``bucket_numel`` elements of
    full matrices plus this rank's shards of the results.
    """

    def __init__(self, bucket_numel: int = 1 << 26) -> None:
        if bucket_numel < 1:
            raise ValueError(f"bucket_numel={bucket_numel} must be positive")
        self.bucket_numel = bucket_numel

    def run(self, updates: Sequence[Tensor], params: Sequence[DTensor], fn: Callable[[Tensor], Tensor]) -> list[Tensor]:
        if not updates:
            return []
        group = shard_group(params[0])
        shards = dist.get_world_size(group)
        me = dist.get_rank(group)
        shapes = [(int(p.shape[0]), int(p.shape[1])) for p in params]
        for i, (u, (rows, _)) in enumerate(zip(updates, shapes, strict=True)):
            if u.shape[0] != chunk_rows(rows, shards)[me]:
                raise ValueError(
                    f"matrix {i}: local shard has {u.shape[0]} rows; the torch.chunk layout of {rows} rows "
                    f"over {shards} ranks gives {chunk_rows(rows, shards)[me]} on rank {me}"
                )
        buckets = plan_buckets(shapes, shards, self.bucket_numel)
        out: list[Tensor] = [updates[0]] * len(updates)
        inbound = self._send_shards(buckets[0], updates, group, shards, me)
        outbound = []
        for k, bucket in enumerate(buckets):
            received = inbound.wait()
            if k + 1 < len(buckets):
                inbound = self._send_shards(buckets[k + 1], updates, group, shards, me)
            results = self._orthogonalize_owned(bucket, received, shards, me, fn)
            outbound.append((bucket, self._send_results(bucket, results, group, shards, me, received)))
        for bucket, exchange in outbound:
            self._unpack(bucket, exchange.wait(), shards, me, out)
        return out

    @staticmethod
    def _send_shards(
        items: list[_Item], updates: Sequence[Tensor], group: dist.ProcessGroup, shards: int, me: int
    ) -> _Exchange:
        send = [updates[it.index].reshape(-1) for d in range(shards) for it in items if it.owner == d]
        send_splits = [
            sum(chunk_rows(it.rows, shards)[me] * it.cols for it in items if it.owner == d) for d in range(shards)
        ]
        mine = [it for it in items if it.owner == me]
        recv_splits = [sum(chunk_rows(it.rows, shards)[s] * it.cols for it in mine) for s in range(shards)]
        like = updates[items[0].index]
        return _all_to_all(send, send_splits, recv_splits, like, group)

    @staticmethod
    def _orthogonalize_owned(
        items: list[_Item], received: Tensor, shards: int, me: int, fn: Callable[[Tensor], Tensor]
    ) -> list[Tensor]:
        mine = [it for it in items if it.owner == me]
        recv_splits = [sum(chunk_rows(it.rows, shards)[s] * it.cols for it in mine) for s in range(shards)]
        per_source = [
            piece.split([chunk_rows(it.rows, shards)[s] * it.cols for it in mine])
            for s, piece in enumerate(received.split(recv_splits))
        ]
        results = []
        for k, it in enumerate(mine):
            full = torch.cat([per_source[s][k].view(-1, it.cols) for s in range(shards)], dim=0)
            result = fn(full)
            if result.dtype != full.dtype or result.shape != full.shape:
                raise ValueError(
                    f"the orthogonalization returned {result.dtype} {tuple(result.shape)} for a "
                    f"{full.dtype} {tuple(full.shape)} input; it must keep dtype and shape"
                )
            results.append(result)
        return results

    @staticmethod
    def _send_results(
        items: list[_Item], results: list[Tensor], group: dist.ProcessGroup, shards: int, me: int, like: Tensor
    ) -> _Exchange:
        mine = [it for it in items if it.owner == me]
        back: list[Tensor] = []
        back_splits = []
        for d in range(shards):
            n = 0
            for it, result in zip(mine, results, strict=True):
                rows = chunk_rows(it.rows, shards)
                block = result[sum(rows[:d]) : sum(rows[:d]) + rows[d]]
                back.append(block.reshape(-1))
                n += block.numel()
            back_splits.append(n)
        recv_splits = [
            sum(chunk_rows(it.rows, shards)[me] * it.cols for it in items if it.owner == s) for s in range(shards)
        ]
        return _all_to_all(back, back_splits, recv_splits, like, group)

    @staticmethod
    def _unpack(items: list[_Item], returned: Tensor, shards: int, me: int, out: list[Tensor]) -> None:
        splits = [
            sum(chunk_rows(it.rows, shards)[me] * it.cols for it in items if it.owner == s) for s in range(shards)
        ]
        for s, piece in enumerate(returned.split(splits)):
            owned = [it for it in items if it.owner == s]
            sizes = [chunk_rows(it.rows, shards)[me] * it.cols for it in owned]
            for it, block in zip(owned, piece.split(sizes), strict=True):
                out[it.index] = block.view(chunk_rows(it.rows, shards)[me], it.cols)


def _all_to_all(
    chunks: list[Tensor], send_splits: list[int], recv_splits: list[int], like: Tensor, group: dist.ProcessGroup
) -> _Exchange:
    """Starts an uneven all-to-all of ``chunks`` (in ``like``'s dtype and device)."""
    send = torch.cat(chunks) if chunks else like.new_empty(0)
    recv = like.new_empty(sum(recv_splits))
    work = dist.all_to_all_single(recv, send, recv_splits, send_splits, group=group, async_op=True)
    return _Exchange(work, recv)
