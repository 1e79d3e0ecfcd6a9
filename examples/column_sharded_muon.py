"""A Muon that shards the model itself, by columns, into plain tensors: the bring-your-own
sharding contract at work (``--impl examples.column_sharded_muon:column_sharded_muon``).

``shard(module, mesh)`` (its ``Candidate``) replaces every parameter with this rank's block of
columns (``torch.tensor_split`` of the last dim over the mesh's ranks, so blocks may be
uneven or empty) as a plain ``nn.Parameter``, with no DTensor to describe it;
``piece(name, param)`` tells the harness which slices of the full tensor the
block is. The optimizer keeps its momentum on the blocks, gathers each matrix's blocks
with ``all_gather`` (padded to the widest block), orthogonalizes the whole matrix with
``reference.orthogonalize`` on every rank, and keeps its own columns; a rank without a
gradient for a matrix that another rank has one for joins with zeros, as the reference counts
the missing piece. Its arithmetic is
muongate's reference on purpose, so the gates judge only the sharding, and bitwise.

``column_sharded_muon_wrong_piece`` declares the same sharding with a reader that names the
next rank's columns: a bug in the declaration, which the gates must catch.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh

import reference
from examples.full_copies import gradient_somewhere
from harness.candidates import Candidate


def _columns(cols: int, ranks: int, rank: int) -> tuple[int, int]:
    """The columns ``[start, stop)`` of ``rank``'s block, as ``torch.tensor_split`` splits them."""
    per, extra = divmod(cols, ranks)
    start = rank * per + min(rank, extra)
    return start, start + per + (rank < extra)


def shard_by_columns(module: nn.Module, mesh: DeviceMesh) -> None:
    """Every parameter of ``module`` becomes this rank's block of its columns."""
    group, ranks, rank = mesh.get_group(), mesh.size(), mesh.get_local_rank()
    for path, p in list(module.named_parameters()):
        owner = module.get_submodule(path.rpartition(".")[0]) if "." in path else module
        start, stop = _columns(p.shape[-1], ranks, rank)
        block = nn.Parameter(p.detach()[..., start:stop].clone())
        block.columns = (start, stop, p.shape[-1], group)  # type: ignore[attr-defined]
        owner.register_parameter(path.rpartition(".")[2], block)


def columns_piece(name: str, param: Tensor) -> tuple[slice, ...]:
    start, stop, _, _ = param.columns
    return (*[slice(None)] * (param.ndim - 1), slice(start, stop))


def neighbours_piece(name: str, param: Tensor) -> tuple[slice, ...]:
    """The planted bug: the block of the next rank's columns, as wide as this one."""
    start, stop, cols, _ = param.columns
    width = stop - start
    shifted = min(stop, cols - width)
    return (*[slice(None)] * (param.ndim - 1), slice(shifted, shifted + width))


def _whole(block: Tensor, p: Tensor) -> Tensor:
    """The full tensor from every rank's ``block`` of ``p``'s columns (``all_gather``, padded to the widest)."""
    start, stop, cols, group = p.columns
    ranks = dist.get_world_size(group)
    widest = max(b - a for a, b in (_columns(cols, ranks, r) for r in range(ranks)))
    padded = block.new_zeros(*block.shape[:-1], widest)
    padded[..., : stop - start] = block
    pieces = [torch.empty_like(padded) for _ in range(ranks)]
    dist.all_gather(pieces, padded.contiguous(), group=group)
    widths = [b - a for a, b in (_columns(cols, ranks, r) for r in range(ranks))]
    return torch.cat([piece[..., :w] for piece, w in zip(pieces, widths, strict=True)], dim=-1)


class ColumnShardedMuon(torch.optim.Optimizer):
    def __init__(self, param_groups: list[dict[str, Any]], **settings: Any) -> None:
        super().__init__(param_groups, {**reference.MUON_DEFAULTS, **settings})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        for group in self.param_groups:
            for p in group["params"]:
                if group["use_muon"] and hasattr(p, "columns") and gradient_somewhere(p, [p.columns[3]]):
                    p.grad = torch.zeros_like(p) if p.grad is None else p.grad
                if p.grad is None:
                    continue
                state = self.state[p]
                if group["use_muon"]:
                    self._muon(p, state, group)
                else:
                    self._adamw(p, state, group)
        return None

    def _muon(self, p: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        buf = state.setdefault("momentum_buffer", torch.zeros_like(p, dtype=torch.float32))
        update = reference.momentum_update(buf, p.grad, group["momentum"], group["nesterov"], group["momentum_form"])
        whole = _whole(update, p) if hasattr(p, "columns") else update
        ortho = reference.group_orthogonalizer(group)(whole)
        if hasattr(p, "columns"):
            start, stop, _, _ = p.columns
            ortho = ortho[..., start:stop]
        scaled = group["lr"] * reference.lr_scale(whole.shape, group["adjust_lr_fn"])
        reference.apply_update(p, ortho, group["lr"], group["weight_decay"], scaled)

    def _adamw(self, p: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        if not state:
            state.update(step=0, exp_avg=torch.zeros_like(p, dtype=torch.float32))
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
        state["step"] += 1
        reference.adamw_update(
            p, p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"], lr=group["adamw_lr"],
            betas=group["adamw_betas"], eps=group["adamw_eps"], weight_decay=group["adamw_weight_decay"],
        )  # fmt: skip


def column_sharded_muon(param_groups: list[dict[str, Any]], **settings: Any) -> ColumnShardedMuon:
    return ColumnShardedMuon(param_groups, **settings)


def column_sharded_muon_wrong_piece(param_groups: list[dict[str, Any]], **settings: Any) -> ColumnShardedMuon:
    return ColumnShardedMuon(param_groups, **settings)


for _factory, _reader in ((column_sharded_muon, columns_piece), (column_sharded_muon_wrong_piece, neighbours_piece)):
    Candidate(
        shard=shard_by_columns,
        piece=_reader,
        features={"adamw", "experts", "bf16"},
    )(_factory)
