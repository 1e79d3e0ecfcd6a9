"""Known-wrong sharded Muons. Each plants one bug that real implementations have shipped;
the gates must catch every one (``test_negative_controls.py``), or they prove nothing.

They are built from public parts only, so that they test the gates and not muongate's own
optimizer: the reference's math (``reference``) and DTensor's own gather and scatter
(``full_tensor``, ``distribute_tensor``). ``PlantedMuon`` is a plain, correct
gather–orthogonalize–scatter Muon; each control overrides exactly one of its steps, so
the bug is the only difference (``test_unplanted_control_matches_the_reference`` holds
``PlantedMuon`` itself to the reference).
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from harness.tasks.common import local_piece
from reference import (
    Muon,
    NorMuon,
    adamw_update,
    apply_blocks,
    apply_update,
    block_scales,
    blocks_of_rows,
    coefficient_schedule,
    group_orthogonalizer,
    lr_scale,
    momentum_update,
)
from reference.muon import row_blocks
from reference.normuon import (
    divided_by,
    divided_by_statistics,
    normalize_neurons,
    rescaled,
    second_moment_shape,
    statistics_dim,
)


def _zeros(p: DTensor) -> DTensor:
    return cast(DTensor, torch.zeros_like(p, dtype=torch.float32))


class PlantedMuon(Muon):
    """Muon on DTensor parameters: momentum on the local piece, the full update gathered on
    every rank, the reference's Newton–Schulz, this rank's piece of the result applied."""

    def _check_param(self, name: str, p: Tensor, use_muon: bool) -> None:
        if not isinstance(p, DTensor):
            raise TypeError(f"parameter {name!r}: expected a DTensor, got a plain tensor of shape {tuple(p.shape)}")
        super()._check_param(name, p, use_muon)

    def _muon_step(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        dp, dgrad = cast(DTensor, p), cast(DTensor, grad)
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = _zeros(dp)
        update = torch.empty(dp.to_local().shape, dtype=group["ns_dtype"], device=dp.to_local().device)
        self.momentum(state["momentum_buffer"].to_local(), dgrad.to_local(), group, update)
        ortho = self.orthogonalized_piece(update, dp, group_orthogonalizer(group, self.orthogonalize_fn))
        scales = block_scales(dp.shape, group)
        if len(set(scales)) > 1:
            self.apply_blocks(dp.to_local(), ortho, group, scales, _global_rows(dp), dp.shape[-2])
            return
        self.apply(dp.to_local(), ortho, group, group["lr"] * self.scale(dp, group))

    def _adamw_step(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:  # type: ignore[override]
        dp = cast(DTensor, p)
        if "step" not in state:
            state.update(step=0, exp_avg=_zeros(dp), exp_avg_sq=_zeros(dp))
        state["step"] += 1
        adamw_update(
            dp.to_local(),
            cast(DTensor, grad).to_local(),
            state["exp_avg"].to_local(),
            state["exp_avg_sq"].to_local(),
            state["step"],
            lr=group["adamw_lr"],
            betas=group["adamw_betas"],
            eps=group["adamw_eps"],
            weight_decay=group["adamw_weight_decay"],
        )

    # -- the steps a control may get wrong --------------------------------------------
    def momentum(self, buf: Tensor, grad: Tensor, group: dict[str, Any], out: Tensor) -> None:
        momentum_update(buf, grad, group["momentum"], group["nesterov"], group["momentum_form"], out=out)

    def orthogonalized_piece(self, update: Tensor, p: DTensor, ns: Any) -> Tensor:
        full = _as_dtensor(update, p).full_tensor()
        return local_piece(ns(full), p)

    def scale(self, p: DTensor, group: dict[str, Any]) -> float:
        return block_scales(p.shape, group)[0]

    def apply_blocks(
        self,
        local: Tensor,
        ortho: Tensor,
        group: dict[str, Any],
        scales: tuple[float, ...],
        rows: list[int],
        total: int,
    ) -> None:
        """Row blocks of unequal lr scales (``ns_split``): each row with its block's."""
        apply_blocks(local, ortho, group, scales, rows, total)

    def apply(self, local: Tensor, ortho: Tensor, group: dict[str, Any], scaled_lr: float) -> None:
        apply_update(local, ortho, group["lr"], group["weight_decay"], scaled_lr)


def _global_rows(p: DTensor) -> list[int]:
    """The row of the whole matrix each of this rank's rows is: the row numbers laid out as ``p`` (DTensor's own scatter)."""
    rows = p.shape[-2]
    mine = local_piece(torch.arange(rows).view(rows, 1).expand(p.shape).contiguous(), p)
    return [] if mine.numel() == 0 else mine[(0,) * (mine.ndim - 2)][:, 0].tolist()


def _as_dtensor(local: Tensor, p: DTensor) -> DTensor:
    return DTensor.from_local(local, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())


class PartialNormMuon(PlantedMuon):
    """Normalizes each shard by a Frobenius norm all-reduced from per-shard partial sums
    before gathering, instead of taking the norm of the gathered matrix."""

    def orthogonalized_piece(self, update: Tensor, p: DTensor, ns: Any) -> Tensor:
        squares = cast(DTensor, _as_dtensor(update.float().pow(2), p).sum()).full_tensor()
        normalized = (update.float() / (squares.sqrt() + 1e-7)).to(update.dtype)
        return super().orthogonalized_piece(normalized, p, ns)


class ShardSumNormMuon(PlantedMuon):
    """Takes Newton–Schulz's Frobenius norm from all-reduced per-shard float32 sums of squares
    (no gather for the norm), in the reference's place and precision: the norm differs from
    the gathered matrix's only in the order of a float32 sum. In bf16 Newton–Schulz the cast
    rounds that last-bit difference away, except where the norm sits on a bf16 rounding tie
    (``harness.cases.tensors.norm_boundary_matrix``): only those inputs catch it there."""

    def _muon_step(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        self._group = group
        super()._muon_step(p, grad, state, group)

    def orthogonalized_piece(self, update: Tensor, p: DTensor, ns: Any) -> Tensor:
        group = self._group
        if update.ndim != 2 or self.orthogonalize_fn is not None:
            return super().orthogonalized_piece(update, p, ns)
        squares = cast(DTensor, _as_dtensor(update.float().pow(2), p).sum()).full_tensor()
        full = _as_dtensor(update, p).full_tensor()
        return local_piece(_newton_schulz_with_norm(full, squares.sqrt(), group), p)


def _newton_schulz_with_norm(G: Tensor, norm: Tensor, group: dict[str, Any]) -> Tensor:
    """``reference.orthogonalize`` of one matrix, with its Frobenius norm given (float32)."""
    schedule, safety = coefficient_schedule(group["ns_coefficients"])
    X = G.to(group["ns_dtype"], copy=True)
    transposed = G.size(0) > G.size(1)
    if transposed:
        X = X.mT
    n = norm.to(X.dtype) * safety if safety != 1.0 else norm.to(X.dtype)
    X = X / (n + group["eps"]) if group["eps_form"] == "add" else X / n.clamp(min=group["eps"])
    for i in range(group["ns_steps"]):
        a, b, c = schedule[min(i, len(schedule) - 1)]
        A = X @ X.mT
        B = torch.addmm(A, A, A, beta=b, alpha=c)
        X = torch.addmm(X, B, X, beta=a)
    return X.mT if transposed else X


class LocalRowsMuon(PlantedMuon):
    """Orthogonalizes only this rank's rows: block-wise, not the full matrix."""

    def orthogonalized_piece(self, update: Tensor, p: DTensor, ns: Any) -> Tensor:
        return ns(update) if update.shape[0] else update


class PaddedGatherMuon(PlantedMuon):
    """Gathers equal-sized padded shards and leaves the zero padding rows in the matrix."""

    def orthogonalized_piece(self, update: Tensor, p: DTensor, ns: Any) -> Tensor:
        mesh = p.device_mesh
        shards = mesh.size(mesh.ndim - 1)
        per = math.ceil(p.shape[0] / shards)
        padded = torch.zeros((per, *update.shape[1:]), dtype=update.dtype, device=update.device)
        padded[: update.shape[0]] = update
        full = ns(DTensor.from_local(padded, mesh, p.placements, run_check=False).full_tensor())
        me = mesh.get_local_rank(mesh.ndim - 1)
        return full[me * per : me * per + update.shape[0]]


class OffByOneRowsMuon(PlantedMuon):
    """Takes this rank's rows of the orthogonalized matrix one row late: an off-by-one
    shard boundary (rows ``start + 1 .. end + 1``, wrapping round at the end)."""

    def orthogonalized_piece(self, update: Tensor, p: DTensor, ns: Any) -> Tensor:
        return local_piece(torch.roll(ns(_as_dtensor(update, p).full_tensor()), -1, dims=0), p)


class LocalShapeLrMuon(PlantedMuon):
    """Computes the lr scale from the local shard's shape instead of the matrix's."""

    def scale(self, p: DTensor, group: dict[str, Any]) -> float:
        shape = p.to_local().shape
        return 1.0 if shape[-2] == 0 else lr_scale(shape, group["adjust_lr_fn"])


class WrongNesterovMuon(PlantedMuon):
    """Mixes Nesterov with the buffer from *before* this step's gradient was added."""

    def momentum(self, buf: Tensor, grad: Tensor, group: dict[str, Any], out: Tensor) -> None:
        g = grad.float()
        old = buf.clone()
        mu = group["momentum"]
        if group["momentum_form"] == "ema":
            buf.lerp_(g, 1 - mu)
            out.copy_(g.lerp(old, mu) if group["nesterov"] else buf)
        else:
            buf.mul_(mu).add_(g)
            out.copy_(g.add(old, alpha=mu) if group["nesterov"] else buf)


class DecayAfterUpdateMuon(PlantedMuon):
    """Applies weight decay after the orthogonalized update instead of before it."""

    def apply(self, local: Tensor, ortho: Tensor, group: dict[str, Any], scaled_lr: float) -> None:
        apply_update(local, ortho, group["lr"], 0.0, scaled_lr)
        if group["weight_decay"]:
            p = local.float()
            p.mul_(1 - group["lr"] * group["weight_decay"])
            local.copy_(p)


# -- layouts: the bugs of tensor-parallel and FSDP2 × TP Muons -------------------------
class LocalColumnsMuon(PlantedMuon):
    """Orthogonalizes a row-wise tensor-parallel weight (``Shard(1)``) on its local columns
    only: Newton–Schulz on the local TP piece instead of the full matrix."""

    def orthogonalized_piece(self, update: Tensor, p: DTensor, ns: Any) -> Tensor:
        if any(isinstance(pl, Shard) and pl.dim == 1 for pl in p.placements) and update.numel():
            return ns(update)
        return super().orthogonalized_piece(update, p, ns)


class StridedOrderMuon(PlantedMuon):
    """Gathers an FSDP2 × TP weight (``_StridedShard``) as if it were plainly sharded, so its
    rows come together in another order than the one they are scattered back in."""

    def orthogonalized_piece(self, update: Tensor, p: DTensor, ns: Any) -> Tensor:
        plain = [Shard(pl.dim) if isinstance(pl, _StridedShard) else pl for pl in p.placements]
        full = DTensor.from_local(update, p.device_mesh, plain, shape=p.shape, stride=p.stride()).full_tensor()
        return local_piece(ns(full), p)


class FirstReplicaMuon(PlantedMuon):
    """Applies a replicated weight's update on the first replica only: the others keep their
    old bits, so the replicas of a ``Replicate`` dim drift apart."""

    def _muon_step(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        self._replica = [
            dp.device_mesh.get_local_rank(i)
            for dp in [cast(DTensor, p)]
            for i, pl in enumerate(dp.placements)
            if isinstance(pl, Replicate)
        ]
        super()._muon_step(p, grad, state, group)

    def apply(self, local: Tensor, ortho: Tensor, group: dict[str, Any], scaled_lr: float) -> None:
        if not any(self._replica):
            super().apply(local, ortho, group, scaled_lr)


class ExpertRowsMuon(PlantedMuon):
    """Orthogonalizes each expert of an expert-parallel stack on this rank's rows of it (its
    ``efsdp`` piece) instead of the whole expert: an expert-parallel Muon that gathers over
    ``ep`` and forgets the expert-FSDP dim."""

    def orthogonalized_piece(self, update: Tensor, p: DTensor, ns: Any) -> Tensor:
        if p.ndim == 3 and any(isinstance(pl, Shard) and pl.dim == 1 for pl in p.placements) and update.numel():
            return ns(update)
        return super().orthogonalized_piece(update, p, ns)


class LocalStateMuon(PlantedMuon):
    """Keeps the momentum buffer as a plain tensor of this rank's piece: the checkpoint stores
    it without its layout, so a checkpoint loaded on another layout gets the wrong rows."""

    def _muon_step(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        dp, dgrad = cast(DTensor, p), cast(DTensor, grad)
        local = dp.to_local()
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros(local.shape, dtype=torch.float32, device=local.device)
        update = torch.empty(local.shape, dtype=group["ns_dtype"], device=local.device)
        self.momentum(state["momentum_buffer"], dgrad.to_local(), group, update)
        ortho = self.orthogonalized_piece(update, dp, group_orthogonalizer(group, self.orthogonalize_fn))
        self.apply(local, ortho, group, group["lr"] * self.scale(dp, group))


class PastFirstBucketMuon(PlantedMuon):
    """Reads every parameter that starts past its first flat bucket one element off: each rank
    packs its local gradients into buckets of ``BUCKET`` elements in the order it steps them,
    and takes a later bucket's offset from the bucket where it should take it from the buffer
    (the 2026 class of a reshardable checkpoint that read every parameter past the first bucket
    at the wrong offset, invisible with one bucket). No drawn case fills one bucket on a rank
    (``tests/test_replay.py`` bounds them), so only a captured layout of a real model's sizes
    shows it (``test_replay_gates.py``)."""

    BUCKET = 2**16

    def step(self, closure: Any = None) -> Any:
        self._offset = 0
        return super().step(closure)

    def _group_step(self, params: list[Tensor], group: dict[str, Any]) -> None:
        for p in params:
            if self._offset >= self.BUCKET:
                grad = cast(DTensor, p.grad).to_local()
                grad.copy_(grad.flatten().roll(1).view_as(grad))
            self._offset += cast(DTensor, p).to_local().numel()
        super()._group_step(params, group)


# -- per-head Newton–Schulz (``ns_heads``): a head is the unit, wherever the shards cut ----------
class LocalHeadsMuon(PlantedMuon):
    """Orthogonalizes the rows it holds, without a gather, as ``ns_heads`` heads, wherever they
    divide into that many: the head count does not follow the split (under AutoTP a stale head
    count made Newton–Schulz run on half-heads)."""

    def orthogonalized_piece(self, update: Tensor, p: DTensor, ns: Any) -> Tensor:
        heads = self._heads
        rows = update.shape[-2]
        if heads > 1 and update.shape[-1] == p.shape[-1] and 0 < rows < p.shape[-2] and rows % heads == 0:
            return cast(Tensor, ns(update))
        return super().orthogonalized_piece(update, p, ns)

    def _muon_step(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        self._heads = group.get("ns_heads", 1)
        super()._muon_step(p, grad, state, group)


class ShardNormHeadsMuon(PlantedMuon):
    """Scales the rows it holds by one factor from their own norm before the gather: one factor
    for every row of its piece, across the head boundaries inside it (under FSDP2, a shard
    spanning a block boundary applied one blended factor to all its rows). The factor is a power
    of two, which a head that one piece holds whole does not see under ``eps_form="clamp"`` while
    its norm stays above ``eps`` (Newton–Schulz divides by the head's norm exactly then): only a
    head that two pieces share, each scaled by its own factor, comes out otherwise."""

    def orthogonalized_piece(self, update: Tensor, p: DTensor, ns: Any) -> Tensor:
        _, exponent = math.frexp(float(update.float().norm()))
        return super().orthogonalized_piece(update * math.ldexp(1.0, -exponent), p, ns)


class FirstBlockScaleMuon(PlantedMuon):
    """Steps every row it holds with the lr scale of the block its first row is in: one factor
    for a piece that spans a block boundary of unequal blocks (``ns_split``), the whole matrix
    on one rank included (under FSDP2, a shard spanning a block boundary applied one blended
    factor to all its rows)."""

    def apply_blocks(
        self,
        local: Tensor,
        ortho: Tensor,
        group: dict[str, Any],
        scales: tuple[float, ...],
        rows: list[int],
        total: int,
    ) -> None:
        if rows:
            (first,) = blocks_of_rows(rows[:1], total, group)
            self.apply(local, ortho, group, group["lr"] * scales[first])


#: the per-head gate's negative controls
class FlattenedRoutingMuon(PlantedMuon):
    """Routes each parameter by its flattened view, as code that routes FSDP1's flat parameters
    (or a 1-D view of a shard) does: no matrix is left, so every one steps with AdamW, the
    silent fallback the routing audit is for."""

    def _muon_step(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        if p.flatten().ndim >= 2:
            super()._muon_step(p, grad, state, group)
        else:
            self._adamw_step(p, grad, state, group)


class NamedFallbackMuon(PlantedMuon):
    """Steps every Muon matrix of an odd number of rows with AdamW (a fallback for a shape its
    kernel does not take, say), silently, keeping AdamW's moments under Muon's state names
    (``momentum_buffer`` and ``momentum_buffer_sq``): its state reads as Muon's everywhere, and
    its single-device self falls back the same way, so only what its steps did shows it."""

    def _muon_step(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        if p.shape[-2] % 2 == 0:
            super()._muon_step(p, grad, state, group)
            return
        moments: dict[str, Any] = {}  # fresh: _adamw_step makes its moments
        if "momentum_buffer" in state:
            moments = {
                "step": state["step"],
                "exp_avg": state["momentum_buffer"],
                "exp_avg_sq": state["momentum_buffer_sq"],
            }
        self._adamw_step(p, grad, moments, group)
        state.update(step=moments["step"], momentum_buffer=moments["exp_avg"], momentum_buffer_sq=moments["exp_avg_sq"])


#: the routing audit's negative controls (``gates/test_routing_gates.py``)
ROUTING_CONTROLS: dict[str, type[PlantedMuon]] = {
    "FlattenedRoutingMuon": FlattenedRoutingMuon,
    "NamedFallbackMuon": NamedFallbackMuon,
}


HEAD_CONTROLS: dict[str, type[PlantedMuon]] = {
    "LocalHeadsMuon": LocalHeadsMuon,
    "ShardNormHeadsMuon": ShardNormHeadsMuon,
    "FirstBlockScaleMuon": FirstBlockScaleMuon,
}


class TileBoundaryMuon(PlantedMuon):
    """Updates the rows of its piece in tiles of ``TILE`` and stops after the first: a rank's
    rows past 64 keep their values, unstepped and undecayed (the slip of a kernel that blocks
    by 64 rows and gets its loop bound wrong). Only a piece of more than 64 rows shows it: the
    drawn sides stay under 48, so only ``harness.cases.tile_shapes`` reaches it."""

    TILE = 64

    def apply(self, local: Tensor, ortho: Tensor, group: dict[str, Any], scaled_lr: float) -> None:
        rows = local.shape[-2] if local.ndim >= 2 else 0
        if rows <= self.TILE:
            super().apply(local, ortho, group, scaled_lr)
            return
        super().apply(local[..., : self.TILE, :], ortho[..., : self.TILE, :], group, scaled_lr)


#: the layout gate's negative controls, and the fewest ranks each needs to show
LAYOUT_CONTROLS: dict[str, tuple[type[PlantedMuon], int]] = {
    "TileBoundaryMuon": (TileBoundaryMuon, 2),
    "LocalColumnsMuon": (LocalColumnsMuon, 2),
    "FirstReplicaMuon": (FirstReplicaMuon, 2),
    "StridedOrderMuon": (StridedOrderMuon, 4),
    "ExpertRowsMuon": (ExpertRowsMuon, 4),
}


class TF32Muon(PlantedMuon):
    """Turns TF32 on for its float32 matmuls and leaves it on, where float32 is declared: a GPU-only
    bug (a CPU has no TF32). The reference steps with float32 matmuls whatever the process's
    switch says (``harness.ranks.switches``), so on a GPU its Newton–Schulz differs."""

    def step(self, closure: Any = None) -> Any:
        torch.set_float32_matmul_precision("high")
        return super().step(closure)


# -- NorMuon: its statistics and norms are the whole matrix's (``reference.normuon``) ----------
class PlantedNorMuon(PlantedMuon, NorMuon):
    """NorMuon on DTensor parameters from the same public parts: ``PlantedMuon``'s momentum,
    gather and Newton–Schulz, the reference's ``normalize_neurons`` of the whole matrix, this
    rank's piece applied; the statistics whole, replicated on every rank."""

    def _muon_step(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        dp, dgrad = cast(DTensor, p), cast(DTensor, grad)
        local = dp.to_local()
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = _zeros(dp)
            whole = torch.zeros(second_moment_shape(dp.shape, group["normuon_axis"]), device=local.device)
            mesh = dp.device_mesh
            state["second_moment"] = DTensor.from_local(whole, mesh, [Replicate()] * mesh.ndim, run_check=False)
        update = torch.empty(local.shape, dtype=group["ns_dtype"], device=local.device)
        self.momentum(state["momentum_buffer"].to_local(), dgrad.to_local(), group, update)
        ortho = group_orthogonalizer(group, self.orthogonalize_fn)(_as_dtensor(update, dp).full_tensor())
        piece, scale = self.normalized_piece(ortho, state["second_moment"].to_local(), dp, group)
        scales = self.block_lr_scales(dp, group, scale)
        if len(set(scales)) > 1:
            self.apply_blocks(local, piece, group, scales, _global_rows(dp), dp.shape[-2])
            return
        self.apply(local, piece, group, group["lr"] * scales[0])

    def normalized_piece(self, ortho: Tensor, v: Tensor, p: DTensor, group: dict[str, Any]) -> tuple[Tensor, float]:
        normalized, scale = normalize_neurons(ortho, v, group, p.shape)
        return local_piece(normalized, p), scale

    def block_lr_scales(self, p: DTensor, group: dict[str, Any], scale: float) -> tuple[float, ...]:
        """The lr scale of each row block, after the normalization: each block's own under the
        Frobenius rescale (``reference.NorMuon._scaled``)."""
        return block_scales(p.shape, group) if group["normuon_scale"] == "frobenius" else (scale,)


def _norm(t: Tensor) -> Tensor:
    return torch.linalg.vector_norm(t, dim=(-2, -1), keepdim=True)


class ShardNormNorMuon(PlantedNorMuon):
    """Rescales each rank's piece by that piece's own norms, not the whole matrix's: the
    statistics are right, the Frobenius (or RMS) rescale is per shard, as microsoft/dion's
    sharded NorMuon does (its code calls it an approximation)."""

    def normalized_piece(self, ortho: Tensor, v: Tensor, p: DTensor, group: dict[str, Any]) -> tuple[Tensor, float]:
        u, divided = divided_by_statistics(ortho, v, group, p.shape)
        piece = local_piece(divided, p)
        update, _ = rescaled(_norm(local_piece(u, p)), piece, group, piece.shape)
        return update, lr_scale(p.shape, group["adjust_lr_fn"]) if group["normuon_scale"] == "frobenius" else 1.0


class PaddedStatisticsNorMuon(PlantedNorMuon):
    """Takes the mean square over FSDP2's padded rows: where the statistics are per column (a
    wide matrix under ``normuon_axis="shape"``), the zero rows that pad the last shard to
    ``ceil(rows / shards)`` count in the mean."""

    def normalized_piece(self, ortho: Tensor, v: Tensor, p: DTensor, group: dict[str, Any]) -> tuple[Tensor, float]:
        shards = p.device_mesh.size(p.device_mesh.ndim - 1)
        rows = p.shape[-2]
        padded = math.ceil(rows / shards) * shards
        if statistics_dim(p.shape, group["normuon_axis"]) != -2 or padded == rows:
            return super().normalized_piece(ortho, v, p, group)
        u = ortho.float()
        v.lerp_((u * u).sum(dim=-2, keepdim=True) / padded, 1 - group["beta2"])
        normalized, scale = rescaled(_norm(u), divided_by(u, v, group), group, p.shape)
        return local_piece(normalized, p), scale


class PieceStatisticsNorMuon(PlantedNorMuon):
    """Takes each row's mean square over this rank's columns of a row-wise tensor-parallel
    weight (``Shard(1)``), and rescales by the piece's norms: NorMuon on the local TP piece."""

    def normalized_piece(self, ortho: Tensor, v: Tensor, p: DTensor, group: dict[str, Any]) -> tuple[Tensor, float]:
        rowwise = any(isinstance(pl, Shard) and pl.dim == 1 for pl in p.placements)
        if not rowwise or statistics_dim(p.shape, group["normuon_axis"]) != -1:
            return super().normalized_piece(ortho, v, p, group)
        piece = local_piece(ortho, p)
        if not piece.numel():
            return piece.float(), 1.0
        u, divided = divided_by_statistics(piece, v, group, p.shape)
        return rescaled(_norm(u), divided, group, p.shape)


class BlockScaleBeforeNormNorMuon(PlantedNorMuon):
    """Multiplies each row block of Newton–Schulz's output (``ns_split``) by its lr scale over the
    whole matrix's right after Newton–Schulz, where the normalization cancels it, and steps every
    block with the whole matrix's lr scale: microsoft/dion's NorMuon with ``split_sizes`` before
    its pull request 113 (its issue 111: blocks of other sizes ran at the wrong learning rate).
    One device shows it, wherever the blocks' lr scales differ."""

    def normalized_piece(self, ortho: Tensor, v: Tensor, p: DTensor, group: dict[str, Any]) -> tuple[Tensor, float]:
        whole = lr_scale(p.shape, group["adjust_lr_fn"])
        sizes, scales = row_blocks(p.shape[-2], group), block_scales(p.shape, group)
        factor = torch.cat([torch.full((n, 1), s / whole) for n, s in zip(sizes, scales, strict=True)])
        return super().normalized_piece(ortho * factor.to(ortho), v, p, group)

    def block_lr_scales(self, p: DTensor, group: dict[str, Any], scale: float) -> tuple[float, ...]:
        return (scale,)  # the whole matrix's, for every block


#: NorMuon's negative controls, with whether each shows on tensor-parallel layouts only
NORMUON_CONTROLS: dict[str, tuple[type[PlantedNorMuon], bool]] = {
    "ShardNormNorMuon": (ShardNormNorMuon, False),
    "PaddedStatisticsNorMuon": (PaddedStatisticsNorMuon, False),
    "PieceStatisticsNorMuon": (PieceStatisticsNorMuon, True),
}


# -- robustness: each fails one scenario of ``test_robustness_gates.py`` the way users report --
class StepsWithoutGradMuon(PlantedMuon):
    """Treats a missing gradient as zeros: a Muon parameter without a gradient still decays
    and moves with its momentum."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None and group["use_muon"]:
                    p.grad = torch.zeros_like(p)
        return super().step(closure)


class EmptyStepMuon(PlantedMuon):
    """Stacks the step's updates into one batch, which fails when no parameter has a gradient."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        torch.stack([p.grad for group in self.param_groups for p in group["params"] if p.grad is not None])
        return super().step(closure)


class EmptyShardSkipMuon(PlantedMuon):
    """Skips a matrix on a rank whose local piece is empty, so its peers wait in the gather."""

    def _muon_step(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        if cast(DTensor, p).to_local().numel():
            super()._muon_step(p, grad, state, group)


class SqueezeMuon(PlantedMuon):
    """Squeezes the gathered update, so a 1-row or 1-column matrix reaches Newton–Schulz as a vector."""

    def orthogonalized_piece(self, update: Tensor, p: DTensor, ns: Any) -> Tensor:
        full = _as_dtensor(update, p).full_tensor().squeeze()
        return local_piece(ns(full).view(p.shape), p)


class MixedDtypeMuon(PlantedMuon):
    """Applies every update in one flat buffer of the group's first parameter's dtype, so the
    other dtypes of a mixed group are rounded through it."""

    def _muon_step(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        self._first_dtype = group["params"][0].dtype
        super()._muon_step(p, grad, state, group)

    def apply(self, local: Tensor, ortho: Tensor, group: dict[str, Any], scaled_lr: float) -> None:
        through = local.to(self._first_dtype)
        apply_update(through, ortho, group["lr"], group["weight_decay"], scaled_lr)
        local.copy_(through)


#: scenario of ``test_robustness_gates.py`` → the planted Muon that must fail it, and how
ROBUSTNESS_CONTROLS: dict[str, tuple[type[PlantedMuon], str]] = {
    # PlantedMuon steps what has a gradient on this rank, as the reference does on one device.
    "rank-asymmetric-gradient": (PlantedMuon, "hang"),
    "step-without-any-gradient": (EmptyStepMuon, "error"),
    "muon-parameter-without-gradient": (StepsWithoutGradMuon, "differs from reference"),
    "empty-local-shards": (EmptyShardSkipMuon, "hang"),
    "one-row-and-one-column": (SqueezeMuon, "error"),
    "mixed-shapes-and-dtypes": (MixedDtypeMuon, "differs from reference"),
}

NEGATIVE_CONTROLS: dict[str, type[PlantedMuon]] = {
    cls.__name__: cls
    for cls in (
        PartialNormMuon,
        ShardSumNormMuon,
        LocalRowsMuon,
        PaddedGatherMuon,
        OffByOneRowsMuon,
        LocalShapeLrMuon,
        WrongNesterovMuon,
        DecayAfterUpdateMuon,
    )
}
