"""Muon (+ AdamW) on sharded parameters (FSDP2, HSDP, TP, FSDP2 × TP, expert parallel):
gather, orthogonalize, scatter.

Per step and per hidden matrix: the momentum is advanced on the local piece only (the
optimizer state stays sharded, about 1/N of it per rank); the update is formed on the
local piece, rounded once to the Newton–Schulz dtype; the full matrix is assembled, either on
every rank (``mode="all_ranks"``) or on one owner rank of the whole mesh
(``mode="owner_split"``, ``distributed_impl.mesh_split``); orthogonalized by the reference's
own function; and each rank applies its piece of the result, with weight decay, to its
local piece. In ``owner_split`` on a 1-D FSDP2 mesh each matrix's update is formed just
before it travels and applied as soon as its rows are back, so no step holds every
matrix's update at once. The lr scale comes from the *global* matrix shape. AdamW runs on
local pieces as it is elementwise.

The math is imported from ``reference``; where rows live is ``distributed_impl.placement``'s,
the owner-split exchange ``distributed_impl.exchange``'s, and the split over the whole
mesh ``distributed_impl.mesh_split``'s. This module owns only the order of the steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Literal, cast, get_args

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor

from distributed_impl import placement
from distributed_impl.batching import SameShapeBatching
from distributed_impl.exchange import OwnerExchange
from distributed_impl.mesh_split import MeshSplit, formed_update
from distributed_impl.qk_clip import sharded_qk_clip
from reference import (
    Muon,
    adamw_update,
    apply_blocks,
    block_scales,
    group_orthogonalizer,
    momentum_update,
    param_names,
)

Mode = Literal["all_ranks", "owner_split"]
Orthogonalizer = Callable[..., Tensor]


class ShardedMuon(Muon):
    """Muon for sharded hidden matrices and AdamW for the rest; same settings as ``reference.Muon``.

    Parameters must be DTensors (from ``fully_shard``, ``parallelize_module`` or
    ``distribute_tensor``) with any placements but ``Partial`` (``placement``).
    Param groups may carry ``param_names`` (as ``named_parameters`` gives them) for errors.

    ``mode``: ``"all_ranks"`` (every rank orthogonalizes every matrix; easiest to audit)
    or ``"owner_split"`` (each matrix on one owner rank of the whole mesh, no replica
    redoing another's; rows exchanged point to point, in buckets of about ``bucket_numel``
    elements per rank). ``batch_numel``: the owner batches equal shapes of at most that many
    elements once a probe agreed bit for bit; off (0) by default, because agreement on one
    input does not prove it for the next (see ``batching``).
    ``orthogonalize_fn``: the Newton–Schulz function, the reference's by default; it is
    called as ``fn(matrix, steps, ns_coefficients=…, eps=…, eps_form=…, dtype=…)``.
    Settings, validation and checkpoint loading are the reference's own.
    """

    #: what it declares when it is itself the ``--impl`` candidate (every layout family): the
    #: fields of ``harness.candidates.Candidate`` as a dict, since this package imports no harness
    muongate: ClassVar[dict[str, Any]] = {
        "layouts": {"hsdp", "tp", "fsdp_tp", "hsdp_tp", "ep_efsdp"},
        "features": {"adamw", "experts", "bf16", "checkpoint", "fully_shard", "heads"},
        "qk_clip": sharded_qk_clip,
    }

    def __init__(
        self,
        params: Iterable[Any],
        *,
        mode: Mode = "all_ranks",
        bucket_numel: int = 1 << 26,
        batch_numel: int = 0,
        orthogonalize_fn: Orthogonalizer | None = None,
        **settings: Any,
    ) -> None:
        if mode not in get_args(Mode):
            raise ValueError(f"mode={mode!r} is not one of {get_args(Mode)}")
        self.mode: Mode = mode
        self._split = MeshSplit(OwnerExchange(bucket_numel))
        self._batching = SameShapeBatching(batch_numel)
        super().__init__(params, orthogonalize_fn=orthogonalize_fn, **settings)

    def _check_param(self, name: str, p: Tensor, use_muon: bool) -> None:
        placement.check_layout(name, p, matrix=use_muon)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        """The reference's step, once every rank agrees on which parameters have a gradient."""
        self._check_gradients_agree()
        return super().step(closure)

    def _check_gradients_agree(self) -> None:
        """Raises ``ValueError`` on every rank, naming the parameter, where a parameter has a
        gradient on some ranks of its mesh and ``None`` on others: stepping it on some ranks
        only would leave the others waiting in its gather for ever. FSDP2 never does that,
        but hand-set gradients and models with rank-dependent control flow do. One small
        all-reduce per mesh dimension per step."""
        names = {
            id(p): name
            for gi, group in enumerate(self.param_groups)
            for name, p in zip(param_names(group, gi), group["params"], strict=True)
        }
        for params in placement.by_mesh([p for group in self.param_groups for p in group["params"]]):
            mesh = params[0].device_mesh
            have = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=params[0].device)
            counts = have.clone()
            for dim in range(mesh.ndim):
                dist.all_reduce(counts, group=mesh.get_group(dim))
            for p, mine, count in zip(params, have.tolist(), counts.tolist(), strict=True):
                if 0 < count < mesh.size():
                    raise ValueError(
                        f"parameter {names[id(p)]!r} (shape {tuple(p.shape)}, placements {p.placements}) has a gradient "
                        f"on {count} of the {mesh.size()} ranks of its mesh; on rank {dist.get_rank()} "
                        f"it has {'one' if mine else 'none'}. Give it a gradient on every rank (zeros where it was "
                        "unused) or on none"
                    )

    def _group_step(self, params: list[Tensor], group: dict[str, Any]) -> None:
        # Every rank agrees on which parameters have a gradient (``_check_gradients_agree``),
        # so the reference's filter on ``grad is None`` keeps every rank's collectives the same.
        sharded = cast(list[DTensor], params)  # checked at construction by check_layout
        if group["use_muon"]:
            self._muon_group(sharded, group)
        else:
            self._adamw_group(sharded, group)

    # -- Muon ---------------------------------------------------------------------------
    def _muon_group(self, params: list[DTensor], group: dict[str, Any]) -> None:
        ns = group_orthogonalizer(group, self.orthogonalize_fn)
        dtype = group["ns_dtype"]
        for p in params:
            if "momentum_buffer" not in self.state[p]:
                self.state[p]["momentum_buffer"] = _zeros_like_sharded(p)
        produce = self._producer(group)

        def apply(p: DTensor, ortho: Tensor) -> None:
            scales = block_scales(p.shape, group)  # the global shape's, a row block's each
            rows = placement.global_rows(p) if len(set(scales)) > 1 else []
            apply_blocks(p.to_local(), ortho, group, scales, rows, p.shape[-2])

        if self.mode == "owner_split":
            self._split.run(
                params, produce, self._batching.orthogonalizer(group, self.orthogonalize_fn), ns, apply, dtype=dtype
            )
            return
        for p in params:  # all_ranks: every rank gathers and orthogonalizes every matrix
            update = formed_update(p, dtype, produce)
            if placement.needs_gather(p):
                apply(p, placement.local_rows(ns(placement.gather_full(update, p)), p))
            else:
                apply(p, ns(update))

    def _producer(self, group: dict[str, Any]) -> Callable[[DTensor, Tensor], None]:
        """``produce(p, out)``: advances ``p``'s local momentum and writes its update to ``out``."""

        def produce(p: DTensor, out: Tensor) -> None:
            buf = self.state[p]["momentum_buffer"].to_local()
            momentum_update(buf, _local(p.grad), group["momentum"], group["nesterov"], group["momentum_form"], out=out)

        return produce

    # -- AdamW --------------------------------------------------------------------------
    def _adamw_group(self, params: list[DTensor], group: dict[str, Any]) -> None:
        for p in params:
            state = self.state[p]
            if "step" not in state:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = _zeros_like_sharded(p)
                state["exp_avg_sq"] = _zeros_like_sharded(p)
            state["step"] += 1
            adamw_update(
                p.to_local(),
                _local(p.grad),
                state["exp_avg"].to_local(),
                state["exp_avg_sq"].to_local(),
                int(state["step"].item()),
                lr=group["adamw_lr"],
                betas=group["adamw_betas"],
                eps=group["adamw_eps"],
                weight_decay=group["adamw_weight_decay"],
            )


def _local(t: Tensor | None) -> Tensor:
    if t is None:
        raise RuntimeError("a parameter without a gradient reached the update; step() filters them")
    return t.to_local() if isinstance(t, DTensor) else t


def _zeros_like_sharded(p: DTensor) -> DTensor:
    """Float32 zeros with the parameter's layout, as a DTensor so DCP can save it."""
    shard = p.to_local()
    local = torch.zeros(shard.shape, dtype=torch.float32, device=shard.device)
    return DTensor.from_local(local, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
