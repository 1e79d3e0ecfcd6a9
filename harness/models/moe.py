"""A small mixture-of-experts model, the empty-expert deadlock on demand, and its fix.

A top-1 router sends every token to one expert. When an expert receives no tokens on one
rank, the *naive* model skips it there: the expert never enters that rank's autograd
graph, so FSDP2's all-gathers and reduce-scatters differ across ranks. What happens then
depends on the wrapping and the shapes: a rank waits for a collective its peer never
enters (a hang), the collective library sees mismatched sizes and kills the process (an
abort), or the collectives pair up with equal shapes but the wrong tensors and training
goes on with wrong numbers (silent corruption).

The *fixed* model runs every expert on every rank, on an empty ``[0, d]`` batch where it
has no tokens, so every rank issues the same collectives. An empty batch adds exact zeros
to the gradient, so the fix changes no numerics.

A ``routing`` override replaces the learned assignment: token ``t`` goes to expert
``t % E`` and tokens of an expert that must be empty on this rank move to the next
allowed expert. Every scenario is therefore deterministic.

An ``MoECase`` is a ``harness.training.TrainingSpec``: FSDP2 + the sharded Muon on
per-rank micro-batches against a single-process reference fed the mean of the same
per-rank gradients (``harness.tasks.training``); ``harness.verdicts.outcomes`` names what a naive run did.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule, fully_shard

from harness.algorithms import MUON
from harness.cases.tensors import generator

Wrapping = Literal["per_expert", "layer", "stacked"]
Variant = Literal["naive", "fixed", "zero_sum", "rs_unused"]


@dataclass(frozen=True)
class MoECase:
    """One deterministic MoE scenario: wrapping, model variant, which (rank, expert) pairs get no tokens.

    ``variant``: ``naive`` skips an expert without tokens; ``fixed`` runs it on an empty
    batch; ``zero_sum`` skips it but adds ``0 * sum(expert parameters)`` to the output;
    ``rs_unused`` is naive with FSDP2's ``set_reduce_scatter_unused_params(True)``.
    """

    name: str
    wrapping: Wrapping
    variant: Variant
    empty: tuple[tuple[int, int], ...]
    world_size: int = 2
    steps: int = 2
    seed: int = 0
    experts: int = 4
    dim: int = 8
    hidden: int = 16
    tokens: int = 12
    candidate: Any = None
    settings: tuple[tuple[str, Any], ...] = field(default=(("lr", 0.02), ("weight_decay", 0.01)))

    @property
    def reference(self) -> Any:
        """The family it trains against: Muon, whose settings it carries, alone."""
        return MUON.factory

    def with_variant(self, variant: Variant) -> MoECase:
        return replace(self, variant=variant)

    # -- harness.tasks.training.TrainingSpec --
    def build(self) -> MoEModel:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return MoEModel(self.dim, self.hidden, self.experts, stacked=self.wrapping == "stacked")

    def shard(self, model: nn.Module, mesh: Any) -> None:
        """``fully_shard`` in this wrapping; ``rs_unused`` turns on FSDP2's unused-parameter reduce-scatter."""
        assert isinstance(model, MoEModel)
        units: list[nn.Module] = [model.dense]
        if self.wrapping == "per_expert":
            units += list(model.moe.experts.children())
        else:
            units.append(model.moe)
        for unit in units:
            fully_shard(unit, mesh=mesh)
        fully_shard(model, mesh=mesh)
        if self.variant == "rs_unused":
            if not reduce_scatter_unused_available():
                raise NotImplementedError(f"torch {torch.__version__}: FSDP2 has no set_reduce_scatter_unused_params")
            for m in model.modules():
                if isinstance(m, FSDPModule):
                    m.set_reduce_scatter_unused_params(True)

    def loss(self, model: nn.Module, rank: int, step: int, device: torch.device) -> Tensor:
        """Mean squared error on ``rank``'s micro-batch, routed as this scenario says for that rank.

        The sharded model runs the scenario's variant; the single-process reference (never
        wrapped by FSDP2) always runs every expert, which is the correct computation.
        """
        assert isinstance(model, MoEModel)
        variant = self.variant if isinstance(model, FSDPModule) else "fixed"
        model.moe.skip_empty = variant != "fixed"
        model.moe.zero_sum = variant == "zero_sum"
        model.moe.routing = frozenset(e for r, e in self.empty if r == rank)
        gen = generator(self.seed, rank, step)
        x = torch.randn(self.tokens, self.dim, generator=gen).to(device)
        y = torch.randn(self.tokens, self.dim, generator=gen).to(device)
        return F.mse_loss(model(x), y)

    def evaluate(self, model: nn.Module, device: torch.device) -> float | None:
        return None

    def describe(self) -> str:
        empty = ", ".join(f"rank {r} expert {e}" for r, e in self.empty) or "none"
        return (
            f"MoECase({self.name}: {self.wrapping} units, {self.variant} model, world={self.world_size}, "
            f"steps={self.steps}, seed={self.seed}, no tokens for: {empty})"
        )


# -- the model ----------------------------------------------------------------------------
class Expert(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.gelu(self.w1(x)))


class StackedExperts(nn.Module):
    """All experts' weights in two 3-D parameters ``[E, hidden, dim]`` and ``[E, dim, hidden]``."""

    def __init__(self, experts: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(experts, hidden, dim) / dim**0.5)
        self.w2 = nn.Parameter(torch.randn(experts, dim, hidden) / hidden**0.5)

    def expert(self, e: int, x: Tensor) -> Tensor:
        return F.gelu(x @ self.w1[e].T) @ self.w2[e].T


def round_robin(tokens: int, experts: int, empty: frozenset[int]) -> Tensor:
    """Token ``t`` to expert ``t % E``; tokens of an expert in ``empty`` move to the next allowed one."""
    if len(empty) >= experts:
        raise ValueError(f"every one of the {experts} experts is marked empty: no expert can take the tokens")

    def target(e: int) -> int:
        return next(a for k in range(experts) if (a := (e + k) % experts) not in empty)

    return torch.tensor([target(t % experts) for t in range(tokens)])


class MoE(nn.Module):
    """Top-1 router + experts. ``empty`` (set per rank) overrides routing; see the module docstring."""

    def __init__(self, dim: int, hidden: int, experts: int, *, stacked: bool = False, residual: bool = True) -> None:
        super().__init__()
        self.num_experts = experts
        self.residual = residual
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts: nn.Module = (
            StackedExperts(experts, dim, hidden)
            if stacked
            else nn.ModuleList(Expert(dim, hidden) for _ in range(experts))
        )
        self.skip_empty = False
        self.zero_sum = False
        self.routing: frozenset[int] | None = None

    def _expert(self, e: int, x: Tensor) -> Tensor:
        if isinstance(self.experts, StackedExperts):
            return self.experts.expert(e, x)
        return self.experts[e](x)  # type: ignore[index]

    def forward(self, x: Tensor) -> Tensor:
        """``Σ_e gate·expert_e(x)`` (plus ``x`` with ``residual``), tokens grouped by expert
        with one permutation.

        One gather in, one gather out, and any residual inside the layer: every tensor
        that gets gradients from more than two places gets them inside this module, in
        the same order with or without FSDP2's hooks at the unit's boundary, so the
        sharded model and the single-process reference sum them identically.
        """
        probs = F.softmax(self.router(x), dim=-1)
        if self.routing is None:
            assign = probs.argmax(dim=-1)
        else:
            assign = round_robin(x.shape[0], self.num_experts, self.routing).to(x.device)
        order = torch.argsort(assign, stable=True)
        counts = torch.bincount(assign, minlength=self.num_experts).tolist()
        tokens = x[order].split(counts)
        gates = probs.gather(1, assign[:, None])[order].split(counts)
        outs = [
            self._expert(e, tokens[e]) * gates[e]
            for e in range(self.num_experts)
            if counts[e] > 0 or not self.skip_empty
        ]
        out = torch.cat(outs)[torch.argsort(order)]
        if self.zero_sum:
            out = out + 0 * sum(p.sum() for p in self.experts.parameters())
        return x + out if self.residual else out


class MoEModel(nn.Module):
    """A dense block, then the MoE layer, both residual."""

    def __init__(self, dim: int, hidden: int, experts: int, *, stacked: bool = False) -> None:
        super().__init__()
        self.dense = nn.Linear(dim, dim)
        self.moe = MoE(dim, hidden, experts, stacked=stacked)

    def forward(self, x: Tensor) -> Tensor:
        return self.moe(x + torch.tanh(self.dense(x)))


def reduce_scatter_unused_available() -> bool:
    return hasattr(FSDPModule, "set_reduce_scatter_unused_params")
