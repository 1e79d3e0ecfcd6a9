"""QK-clip on one device: MuonClip's rescale of the query and key projections, head by head.

MuonClip (Kimi K2, arXiv 2507.20534, 2025) follows each Muon step with QK-clip: for every
attention head ``h`` whose largest pre-softmax logit ``S_h`` over the step's batch exceeds a
threshold ``tau``, the head's rows of the query projection are scaled by ``η_h^α`` and its rows
of the key projection by ``η_h^(1−α)``, ``η_h = tau / S_h`` (``α = 0.5`` in the paper), so
that the head's logits shrink by ``η_h`` and nothing else changes. ``S_h`` is the maximum over
the *whole* batch: in data-parallel training every replica must take the maximum over all the
replicas' micro-batches, or the replicas scale their copies differently and diverge.

Here the projections are ``[heads · head_dim, cols]`` matrices (multi-head attention: one key
head per query head), ``S`` is a ``[heads]`` tensor of the batch's maxima, and the factor is
computed in float32 and applied to the weight in its own dtype (``w.mul_(factor)`` row by row):
a head at or below ``tau`` is left as it is, bit for bit.
"""

from __future__ import annotations

import torch
from torch import Tensor


def clip_factors(max_logits: Tensor, tau: float, alpha: float = 0.5) -> tuple[Tensor, Tensor]:
    """Per head, the float32 factors of the query rows and of the key rows: ``(η^α, η^(1−α))``
    with ``η = min(1, tau / S)``; exactly 1 where ``S <= tau``."""
    if not tau > 0:
        raise ValueError(f"tau={tau!r}: the logit threshold must be > 0")
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha={alpha!r}: the query's share of the factor must be in [0, 1]")
    s = max_logits.detach().to(torch.float32)
    clipped = s > tau
    eta = torch.where(clipped, tau / torch.where(clipped, s, torch.ones_like(s)), torch.ones_like(s))
    one = torch.ones_like(eta)
    return torch.where(clipped, eta.pow(alpha), one), torch.where(clipped, eta.pow(1 - alpha), one)


def head_of_rows(rows: int, heads: int) -> Tensor:
    """Which head each of a projection's ``rows`` rows belongs to (heads of equal size)."""
    if heads < 1 or rows % heads:
        raise ValueError(f"heads={heads}: a projection of {rows} rows is not {heads} heads of equal size")
    return torch.arange(rows) // (rows // heads)


def qk_clip_(w_q: Tensor, w_k: Tensor, max_logits: Tensor, tau: float, alpha: float = 0.5) -> None:
    """QK-clip in place on whole projections of ``len(max_logits)`` heads."""
    heads = max_logits.numel()
    q_factor, k_factor = clip_factors(max_logits, tau, alpha)
    for w, factor in ((w_q, q_factor), (w_k, k_factor)):
        per_row = factor[head_of_rows(w.shape[0], heads)].to(w.device)
        w.mul_(per_row.unsqueeze(-1))
