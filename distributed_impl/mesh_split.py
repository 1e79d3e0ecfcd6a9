"""Owner split over a whole mesh, for every layout: each matrix is orthogonalized on one rank
of the mesh, and no replica redoes what another does.

* 2-D matrices go to the rows layout (``placement.rows_layout``: rows over the mesh's last
  dim, replicated over the others) by DTensor's own ``redistribute``, which is free for
  FSDP2's and HSDP's layouts and an all-to-all for a tensor-parallel ``Shard(1)``. The
  matrices of a mesh are then split between the copies of that layout (the replicas: one
  on a 1-D mesh, two on a ``(2, n)`` mesh) by Newton–Schulz cost; inside a copy, the owner
  exchange (``exchange.OwnerExchange``) gives each matrix one owner rank over the last dim.
  Each result is then broadcast from its copy to the others, and laid back out as the
  parameter is.
* 3-D expert stacks go to ``placement.experts_layout`` (experts over every mesh dim, so each
  rank holds whole matrices), are orthogonalized there, and go back.

FSDP2 on a 1-D mesh, the layout the benchmark times, needs none of that: its matrices go
straight through the exchange, each update formed just before it travels and applied as
soon as its rows are back. Every other layout forms its updates in one pass and applies
them in another, in the same order on every rank, since laying them out again and
broadcasting them are collectives every rank must post in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from distributed_impl import placement
from distributed_impl.exchange import OwnerExchange, assign_owners

Produce = Callable[[DTensor, Tensor], None]
Apply = Callable[[DTensor, Tensor], None]
Many = Callable[[list[Tensor]], list[Tensor]]
One = Callable[[Tensor], Tensor]


class MeshSplit:
    """``run(params, produce, many, one, apply)``: ``produce(p, out)`` writes this rank's piece
    of ``p``'s update (laid out as ``p``) into ``out``; ``many`` orthogonalizes a list of full
    matrices, ``one`` a stack of whole experts; ``apply(p, piece)`` takes this rank's piece of
    the result, laid out as ``p``."""

    def __init__(self, exchange: OwnerExchange) -> None:
        self.exchange = exchange

    def run(
        self, params: Sequence[DTensor], produce: Produce, many: Many, one: One, apply: Apply, *, dtype: torch.dtype
    ) -> None:
        for p in params:
            if p.ndim == 3:
                layout = placement.experts_layout(p)
                experts = placement.relayout(formed_update(p, dtype, produce), p, layout).to_local()
                apply(p, placement.restore(one(experts) if experts.shape[0] else experts, p, layout))
        for matrices in placement.by_mesh([p for p in params if p.ndim == 2]):
            self._matrices(matrices, produce, many, apply, dtype)

    def _matrices(self, params: list[DTensor], produce: Produce, many: Many, apply: Apply, dtype: torch.dtype) -> None:
        copies, mine = placement.replicas(params[0]), placement.replica_index(params[0])
        copy_of = assign_owners([(int(p.shape[0]), int(p.shape[1])) for p in params], copies)
        straight = [copies == 1 and placement.in_layout(p, placement.rows_layout(p)) for p in params]
        formed: dict[int, DTensor] = {}  # this copy's updates in the rows layout, formed ahead
        for k, p in enumerate(params):
            if not straight[k]:
                laid = placement.relayout(formed_update(p, dtype, produce), p, placement.rows_layout(p))
                if copy_of[k] == mine:  # every copy advances every matrix's momentum, above
                    formed[k] = laid
        owned = [k for k in range(len(params)) if copy_of[k] == mine]
        results: dict[int, Tensor] = {}

        def give(j: int, out: Tensor) -> None:
            k = owned[j]
            if straight[k]:
                produce(params[k], out)
            else:
                out.copy_(formed.pop(k).to_local())

        def take(j: int, piece: Tensor) -> None:
            k = owned[j]
            if straight[k]:
                apply(params[k], piece)
            else:
                results[k] = piece

        self.exchange.run([params[k] if straight[k] else formed[k] for k in owned], give, many, take, dtype=dtype)
        for k, p in enumerate(params):
            if straight[k]:
                continue
            piece = results.pop(k) if k in results else placement.empty_rows(p, dtype)
            if copies > 1:
                piece = piece.contiguous()
                placement.broadcast_from_replica(piece, p, copy_of[k])
            apply(p, placement.restore(piece, p, placement.rows_layout(p)))


def formed_update(p: DTensor, dtype: torch.dtype, produce: Produce) -> Tensor:
    """``p``'s update on this rank, laid out as ``p``."""
    shard = p.to_local()
    update = torch.empty(shard.shape, dtype=dtype, device=shard.device)
    produce(p, update)
    return update
