"""QK-clip on sharded query and key projections (MuonClip's, ``reference.qk_clip``).

Each rank observes the largest attention logit of each head on its own micro-batches. The
maximum over the batch is the maximum over every rank of the projections' mesh (a tensor-
parallel rank shares its replica's batch, so taking it there too changes nothing); then each
rank scales the rows it holds, each by the factor of the head that row belongs to in the whole
matrix (``placement.global_rows``), never by a head count of its own piece.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from distributed_impl.placement import global_rows
from reference.qk_clip import clip_factors, head_of_rows


def batch_max(p: DTensor, observed: Tensor) -> Tensor:
    """The maximum of ``observed`` over every rank of ``p``'s mesh (every rank joins)."""
    largest = observed.detach().to(torch.float32, copy=True).to(p.to_local().device)
    mesh = p.device_mesh
    for dim in range(mesh.ndim):
        dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=mesh.get_group(dim))
    return largest


def scale_rows(p: DTensor, factor: Tensor, heads: int) -> None:
    """Each row this rank holds of ``p``, times its head's ``factor``."""
    local = p.to_local()
    rows = global_rows(p)
    if local.numel() == 0 or not rows:
        return
    head = head_of_rows(p.shape[-2], heads)[torch.tensor(rows)]
    local.mul_(factor[head].to(local.device).unsqueeze(-1))


def clip_pair(q: DTensor, k: DTensor, largest: Tensor, tau: float, alpha: float) -> None:
    """Scales the rows this rank holds of ``q`` and ``k`` by the factors of ``largest``, each
    head's largest logit."""
    q_factor, k_factor = clip_factors(largest, tau, alpha)
    scale_rows(q, q_factor, largest.numel())
    scale_rows(k, k_factor, largest.numel())


@torch.no_grad()
def sharded_qk_clip(model: nn.Module, pairs: Iterable[tuple[str, str, Tensor]], tau: float, alpha: float) -> None:
    """QK-clip of each ``(query name, key name, this rank's maxima by head)`` of ``model``."""
    for q_name, k_name, observed in pairs:
        q, k = (cast(DTensor, model.get_parameter(name)) for name in (q_name, k_name))
        clip_pair(q, k, batch_max(q, observed), tau, alpha)
