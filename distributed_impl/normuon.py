"""NorMuon (+ AdamW) on sharded parameters: ``ShardedMuon``'s gather, then NorMuon's per-neuron
normalization of the whole matrix on every rank, then this rank's piece.

NorMuon's row statistics and its two Frobenius norms are of the whole matrix
(``reference.normuon``): a piece of Newton–Schulz's output says nothing of the rows' other
columns (a ``Shard(1)`` piece) nor of the other rows' norm (a ``Shard(0)`` piece). So every rank
gathers the update, orthogonalizes it and normalizes it whole, as ``ShardedMuon``'s
``mode="all_ranks"`` does, and keeps the statistics (``second_moment``) whole too, replicated
over the mesh; a 3-D stack split only on its experts needs no gather, and keeps its experts'
statistics where its experts are. The momentum stays sharded. The arithmetic is the
reference's own (``normalize_neurons``, then each row block's lr scale: ``NorMuon._scaled``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch.distributed.tensor import DTensor, Replicate

from distributed_impl import placement
from distributed_impl.mesh_split import formed_update
from distributed_impl.muon import Mode, ShardedMuon, _zeros_like_sharded
from reference import NorMuon, apply_blocks, group_orthogonalizer
from reference.normuon import second_moment_shape


class ShardedNorMuon(ShardedMuon, NorMuon):
    """NorMuon for sharded hidden matrices and AdamW for the rest; the settings of
    ``reference.NorMuon``, and the layouts of ``ShardedMuon``. ``mode`` is ``"all_ranks"``
    only: the owner split would have to carry the statistics to each matrix's owner."""

    #: ``ShardedMuon``'s declaration, judged against NorMuon: ``--impl`` alone picks the reference
    muongate: ClassVar[dict[str, Any]] = {**ShardedMuon.muongate, "reference": NorMuon}

    def __init__(self, params: Iterable[Any], *, mode: Mode = "all_ranks", **settings: Any) -> None:
        if mode != "all_ranks":
            raise ValueError(
                f"mode={mode!r}: ShardedNorMuon normalizes each whole matrix on every rank (mode='all_ranks') only"
            )
        super().__init__(params, mode=mode, **settings)

    def _muon_group(self, params: list[DTensor], group: dict[str, Any]) -> None:
        ns = group_orthogonalizer(group, self.orthogonalize_fn)
        produce = self._producer(group)
        for p in params:
            state = self.state[p]
            whole = placement.needs_gather(p)
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = _zeros_like_sharded(p)
                state["second_moment"] = _statistics(p, group["normuon_axis"], whole)
            update = formed_update(p, group["ns_dtype"], produce)
            ortho = ns(placement.gather_full(update, p) if whole else update)
            statistics = {"second_moment": state["second_moment"].to_local()}
            normalized, scales = NorMuon._scaled(ortho, statistics, group, p.shape)  # each row block's lr scale
            piece = placement.local_rows(normalized, p) if whole else normalized
            rows = placement.global_rows(p) if len(set(scales)) > 1 else []
            apply_blocks(p.to_local(), piece, group, scales, rows, p.shape[-2])


def _statistics(p: DTensor, axis: Any, whole: bool) -> DTensor:
    """Float32 zeros for ``p``'s row statistics: whole and replicated where its matrices are
    gathered, else laid out as ``p`` (whole experts on each rank)."""
    mesh = p.device_mesh
    shape = second_moment_shape(p.shape, axis)
    if whole:
        local = torch.zeros(shape, dtype=torch.float32, device=p.to_local().device)
        return DTensor.from_local(local, mesh, [Replicate()] * mesh.ndim, run_check=False)
    local = torch.zeros(second_moment_shape(p.to_local().shape, axis), dtype=torch.float32, device=p.to_local().device)
    return DTensor.from_local(local, mesh, p.placements, shape=torch.Size(shape), stride=_contiguous(shape))


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(torch.empty(shape, device="meta").stride())
