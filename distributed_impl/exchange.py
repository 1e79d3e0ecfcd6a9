"""Owner-split orthogonalization: who owns which matrix, in which bucket, and how its
rows travel there and back.

Each matrix has one owner rank (balanced by Newton–Schulz cost, bucket by bucket); every
rank sends its rows to the owner, straight into the rows of one full-matrix buffer, the
owner orthogonalizes, and sends each rank its rows back; point-to-point sends and
receives are batched per bucket. Each rank does 1/S of the matrix work. Where rows live
is ``distributed_impl.placement``'s business; this module asks it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor

from distributed_impl.placement import chunk_rows, row_spans, shard_group


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
    (or one round, below), with owners balanced *within* each bucket.

    Every bucket ends in an exchange all ranks wait for, so a bucket's time is its
    busiest owner's: balancing each bucket, not only the total, is what halves the time.
    So buckets are made of rounds: ``shards`` matrices of one shape, one for each owner
    (a shape's last round may be short), and a round is never split. A tall and a wide
    matrix of equal cost still take different times, so only equal shapes share a round.
    """
    order = sorted(range(len(shapes)), key=lambda i: (-_cost(shapes[i]), shapes[i], i))
    rounds: list[list[int]] = []
    for i in order:
        if rounds and len(rounds[-1]) < shards and shapes[rounds[-1][0]] == shapes[i]:
            rounds[-1].append(i)
        else:
            rounds.append([i])
    buckets: list[list[int]] = []
    current: list[int] = []
    used = 0
    for round_ in rounds:
        numel = sum(shapes[i][0] * shapes[i][1] for i in round_)
        if current and used + numel > bucket_numel * shards:
            buckets.append(current)
            current, used = [], 0
        current += round_
        used += numel
    if current:
        buckets.append(current)
    planned = []
    for bucket in buckets:
        owners = assign_owners([shapes[i] for i in bucket], shards)
        planned.append([_Item(i, shapes[i][0], shapes[i][1], o) for i, o in zip(bucket, owners, strict=True)])
    return planned


class _Transfer:
    """Point-to-point sends and receives in flight (one batch). ``wait`` may be called more
    than once (a batch carries one bucket's results and a later bucket's shards); only the
    first call waits, as gloo's send and receive works wait for one more completion on
    every call."""

    def __init__(self, ops: list[dist.P2POp]) -> None:
        self.works = dist.batch_isend_irecv(ops) if ops else []

    def wait(self) -> None:
        works, self.works = self.works, []
        for work in works:
            work.wait()


Produce = Callable[[int, Tensor], object]  # what it returns is ignored
Apply = Callable[[int, Tensor], None]
Rows = list[tuple[int, Tensor]]  # (matrix index, this rank's rows of its result)


class OwnerExchange:
    """Orthogonalizes sharded matrices, each on one owner rank, bucket by bucket.

    ``run(params, produce, fn, apply)``: for matrix ``k``, ``produce(k, out)`` writes this
    rank's rows of the matrix (its local update shard) into ``out``; the owner
    orthogonalizes its full matrices of a bucket with ``fn`` (a list in, a list out, so
    that it may batch them); and ``apply(k, rows)`` receives this rank's
    rows of the result. Rows travel by point-to-point sends and receives straight into
    place: the owner writes its own rows and receives the others' into the rows of one
    full-matrix buffer, and sends each rank its rows of the result (packed only when they
    are not one block of memory). The owner applies its own rows of the result without a
    copy.

    Pipeline: shards travel two buckets ahead. Right after bucket ``k`` is orthogonalized,
    one batch of transfers carries bucket ``k``'s results back and bucket ``k+2``'s shards
    out, while this rank applies results and forms updates (elementwise work) rather than
    while it multiplies matrices, which an NCCL kernel beside them slows. Each matrix is
    produced just before its bucket is sent and applied once its rows are back, so extra
    memory per rank is about four buckets of ``bucket_numel`` elements per rank, whatever
    the number of matrices.
    """

    def __init__(self, bucket_numel: int = 1 << 26) -> None:
        if bucket_numel < 1:
            raise ValueError(f"bucket_numel={bucket_numel} must be positive")
        self.bucket_numel = bucket_numel

    def run(
        self,
        params: Sequence[DTensor],
        produce: Produce,
        fn: Callable[[list[Tensor]], list[Tensor]],
        apply: Apply,
        *,
        dtype: torch.dtype,
    ) -> None:
        if not params:
            return
        group = shard_group(params[0])
        shards = dist.get_world_size(group)
        me = dist.get_rank(group)
        peers = [dist.get_global_rank(group, r) for r in range(shards)]
        shapes = [(int(p.shape[0]), int(p.shape[1])) for p in params]
        for k, (p, (rows, _)) in enumerate(zip(params, shapes, strict=True)):
            local, expected = p.to_local().shape[0], chunk_rows(rows, shards)[me]
            if local != expected:
                raise ValueError(
                    f"matrix {k}: local shard has {local} rows; the torch.chunk layout of {rows} rows "
                    f"over {shards} ranks gives {expected} on rank {me}"
                )
        device = params[0].to_local().device
        send = _Sender(group, shards, me, peers, device, dtype)
        buckets = plan_buckets(shapes, shards, self.bucket_numel)
        # inbound[k]: the transfer that brings bucket k's shards, and the full matrices it fills
        inbound: dict[int, tuple[_Transfer, dict[int, Tensor]]] = {}
        for k in range(min(2, len(buckets))):
            ops, fulls = send.shards(buckets[k], produce)
            inbound[k] = (_Transfer(ops), fulls)
        returning: tuple[_Transfer, Rows] | None = None
        for k, bucket in enumerate(buckets):
            arriving, fulls = inbound.pop(k)
            arriving.wait()
            owned = list(fulls)
            done = fn([fulls[i] for i in owned])
            results = {i: _checked(fulls[i], r) for i, r in zip(owned, done, strict=True)}
            ops, incoming, own = send.results(bucket, results)
            if k + 2 < len(buckets):
                shard_ops, ahead = send.shards(buckets[k + 2], produce)
                transfer = _Transfer(ops + shard_ops)
                inbound[k + 2] = (transfer, ahead)
            else:
                transfer = _Transfer(ops)
            _apply_all(own, apply)
            if returning is not None:
                _land(*returning, apply)
            returning = (transfer, incoming)
        if returning is not None:
            _land(*returning, apply)


class _Sender:
    """Builds one bucket's transfers in the same order on every rank (point-to-point
    operations pair up in the order they are posted)."""

    def __init__(
        self,
        group: dist.ProcessGroup,
        shards: int,
        me: int,
        peers: list[int],
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.group, self.world, self.me, self.peers = group, shards, me, peers
        self.device, self.dtype = device, dtype

    def _empty(self, rows: int, cols: int) -> Tensor:
        return torch.empty(rows, cols, dtype=self.dtype, device=self.device)

    def _op(self, op: Callable[..., Any], tensor: Tensor, rank: int) -> dist.P2POp:
        return dist.P2POp(op, tensor, self.peers[rank], self.group)

    def shards(self, items: list[_Item], produce: Produce) -> tuple[list[dist.P2POp], dict[int, Tensor]]:
        """Produces this rank's rows of each matrix, to be sent to the owner; the owner
        writes its own rows into the full matrix and receives the others' rows there.
        Returns the operations and the owner's full matrices they fill."""
        ops: list[dist.P2POp] = []
        fulls: dict[int, Tensor] = {}
        for it in items:
            spans = row_spans(it.rows, self.world)
            if it.owner == self.me:
                full = self._empty(it.rows, it.cols)
                produce(it.index, full[spans[self.me]])
                ops += [
                    self._op(dist.irecv, full[span], s)
                    for s, span in enumerate(spans)
                    if s != self.me and span.stop > span.start
                ]
                fulls[it.index] = full
            else:
                mine = self._empty(spans[self.me].stop - spans[self.me].start, it.cols)
                produce(it.index, mine)
                if mine.numel():
                    ops.append(self._op(dist.isend, mine, it.owner))
        return ops, fulls

    def results(self, items: list[_Item], results: dict[int, Tensor]) -> tuple[list[dist.P2POp], Rows, Rows]:
        """The operations that send each rank its rows of the owned results and receive
        this rank's rows of the others'; the rows those receives fill; and this rank's own
        rows of its results, ready now.

        Rows of a tall matrix travel transposed: Newton–Schulz works on the transpose of a
        tall matrix and returns a transposed view, so a block of its rows is a block of
        whole rows of that transpose, which packs by plain row copies. The receiver applies
        the transposed view; the numbers are the same, element by element.
        """
        ops: list[dist.P2POp] = []
        incoming: Rows = []
        own: Rows = []
        for it in items:
            spans = row_spans(it.rows, self.world)
            tall = it.rows > it.cols
            if it.owner == self.me:
                result = results[it.index]
                for d, span in enumerate(spans):
                    if d != self.me and span.stop > span.start:
                        block = result[span].T if tall else result[span]
                        ops.append(self._op(dist.isend, block.contiguous(), d))
                own.append((it.index, result[spans[self.me]]))
            else:
                n = spans[self.me].stop - spans[self.me].start
                wire = self._empty(it.cols, n) if tall else self._empty(n, it.cols)
                if wire.numel():
                    ops.append(self._op(dist.irecv, wire, it.owner))
                incoming.append((it.index, wire.T if tall else wire))
        return ops, incoming, own


def _apply_all(rows: Rows, apply: Apply) -> None:
    for index, r in rows:
        apply(index, r)


def _land(transfer: _Transfer, rows: Rows, apply: Apply) -> None:
    """Waits for ``transfer`` to fill ``rows``, then applies them."""
    transfer.wait()
    _apply_all(rows, apply)


def _checked(full: Tensor, result: Tensor) -> Tensor:
    if result.dtype != full.dtype or result.shape != full.shape:
        raise ValueError(
            f"the orthogonalization returned {result.dtype} {tuple(result.shape)} for a "
            f"{full.dtype} {tuple(full.shape)} input; it must keep dtype and shape"
        )
    return result
