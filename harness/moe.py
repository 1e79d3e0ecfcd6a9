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

The claim checked by ``run_moe_case``: FSDP2 + the sharded Muon, ``steps`` steps on
per-rank micro-batches, against a single-process model and ``reference.Muon`` fed the
mean of the same per-rank gradients. Losses, gradients, parameters and optimizer state
are compared. On 2 ranks averaging two gradients is order-independent, so the verdict is
bitwise; beyond 2 ranks the tier is ``reduction_order`` (FSDP2 sums in its own order).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule, fully_shard

import reference
from harness.compare import BITWISE, Comparison, Tier, compare
from harness.pool import CaseOutcome, RankContext
from harness.tasks import STATE_KEYS, compare_shard, load_object, mesh_for

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
    candidate: str = "distributed_impl:ShardedMuon"
    settings: tuple[tuple[str, Any], ...] = field(default=(("lr", 0.02), ("weight_decay", 0.01)))

    def with_variant(self, variant: Variant) -> MoECase:
        return replace(self, variant=variant)

    def describe(self) -> str:
        empty = ", ".join(f"rank {r} expert {e}" for r, e in self.empty) or "none"
        return (
            f"MoECase({self.name}: {self.wrapping} units, {self.variant} model, world={self.world_size}, "
            f"steps={self.steps}, seed={self.seed}, no tokens for: {empty})"
        )


def reduction_order(case: MoECase) -> Tier:
    """The tier beyond 2 ranks, where FSDP2 sums the per-rank gradients in its own order."""
    lr = dict(case.settings).get("lr", reference.MUON_DEFAULTS["lr"])
    return Tier(
        "reduction_order",
        "tolerance",
        f"{case.world_size} ranks: FSDP2 sums per-rank gradients in its own order, the reference in rank order; "
        "a last-bit difference in a gradient can move one bf16 rounding inside Newton-Schulz, about "
        "lr * 2^-7 per element per step",
        atol=case.steps * lr * 2**-7,
        rtol=1e-5,
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

    def __init__(self, dim: int, hidden: int, experts: int, *, stacked: bool = False) -> None:
        super().__init__()
        self.num_experts = experts
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
        """``x + Σ_e gate·expert_e(x)``, tokens grouped by expert with one permutation.

        One gather in, one gather out, and the residual inside the layer: every tensor
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
        return x + out


class MoEModel(nn.Module):
    """A dense block, then the MoE layer, both residual."""

    def __init__(self, dim: int, hidden: int, experts: int, *, stacked: bool = False) -> None:
        super().__init__()
        self.dense = nn.Linear(dim, dim)
        self.moe = MoE(dim, hidden, experts, stacked=stacked)

    def forward(self, x: Tensor) -> Tensor:
        return self.moe(x + torch.tanh(self.dense(x)))


def build_model(case: MoECase) -> MoEModel:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case.seed)
        return MoEModel(case.dim, case.hidden, case.experts, stacked=case.wrapping == "stacked")


def shard_model(model: MoEModel, case: MoECase, mesh: Any) -> None:
    """``fully_shard`` in the case's wrapping; ``rs_unused`` sets FSDP2's unused-parameter reduce-scatter."""
    units: list[nn.Module] = [model.dense]
    if case.wrapping == "per_expert":
        units += list(model.moe.experts.children())
    else:
        units.append(model.moe)
    for unit in units:
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if case.variant == "rs_unused":
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_reduce_scatter_unused_params(True)


def configure(model: MoEModel, variant: Variant, empty: frozenset[int]) -> None:
    model.moe.skip_empty = variant != "fixed"
    model.moe.zero_sum = variant == "zero_sum"
    model.moe.routing = empty


def micro_batch(case: MoECase, rank: int, step: int, device: torch.device) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(case.seed * 1_000_003 + 7919 * step + rank)
    x = torch.randn(case.tokens, case.dim, generator=gen)
    y = torch.randn(case.tokens, case.dim, generator=gen)
    return x.to(device), y.to(device)


def empty_on(case: MoECase, rank: int) -> frozenset[int]:
    return frozenset(e for r, e in case.empty if r == rank)


def _groups(model: nn.Module) -> list[dict[str, Any]]:
    named = list(model.named_parameters())
    muon = [(n, p) for n, p in named if p.ndim >= 2]
    other = [(n, p) for n, p in named if p.ndim < 2]
    return [
        {"params": [p for _, p in muon], "param_names": [n for n, _ in muon], "use_muon": True},
        {"params": [p for _, p in other], "param_names": [n for n, _ in other], "use_muon": False},
    ]


# -- the rank task --------------------------------------------------------------------------
def run_moe_case(ctx: RankContext, payload: tuple[str, MoECase]) -> list[dict[str, Any]]:
    """FSDP2 + the candidate optimizer on this rank's micro-batches, compared with the
    single-process reference after every step (no collective outside FSDP2 and the optimizer)."""
    gate, case = payload
    device = torch.device(ctx.device)
    ref_model = build_model(case).to(device)
    model = copy.deepcopy(ref_model)
    configure(ref_model, "fixed", frozenset())
    configure(model, case.variant, empty_on(case, ctx.rank))
    settings = dict(case.settings)
    ref_opt = reference.Muon(_groups(ref_model), **settings)
    shard_model(model, case, mesh_for(ctx, (case.world_size,)))
    opt = load_object(case.candidate)(_groups(model), **settings)
    tier = BITWISE if case.world_size <= 2 else reduction_order(case)
    records: list[Comparison] = []
    for step in range(case.steps):
        ref_loss = _reference_grads(ref_model, case, step, device)
        x, y = micro_batch(case, ctx.rank, step, device)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        records.append(
            compare(ref_loss[ctx.rank], loss.detach(), gate=gate, tensor="loss", step=step, rank=ctx.rank, tier=tier)
        )
        names = dict(model.named_parameters())
        for name, ref_p in ref_model.named_parameters():
            grad = names[name].grad
            if grad is not None and ref_p.grad is not None:
                records.append(compare_shard(gate, f"{name}.grad", step, ctx.rank, ref_p.grad, grad, tier))
        ref_opt.step()
        ref_opt.zero_grad()
        opt.step()
        opt.zero_grad()
        for name, ref_p in ref_model.named_parameters():
            p = names[name]
            records.append(compare_shard(gate, name, step, ctx.rank, ref_p.detach(), p.detach(), tier))
            for key in STATE_KEYS:
                if key in ref_opt.state.get(ref_p, {}) and key in opt.state.get(p, {}):
                    records.append(
                        compare_shard(
                            gate, f"{name}.{key}", step, ctx.rank, ref_opt.state[ref_p][key], opt.state[p][key], tier
                        )
                    )
    return [r.to_record() for r in records]


def _reference_grads(model: MoEModel, case: MoECase, step: int, device: torch.device) -> list[Tensor]:
    """Per-rank losses of the reference; its ``.grad`` becomes the mean of the per-rank gradients."""
    params = list(model.parameters())
    total: list[Tensor] = [torch.zeros_like(p) for p in params]
    losses = []
    for rank in range(case.world_size):
        model.moe.routing = empty_on(case, rank)
        x, y = micro_batch(case, rank, step, device)
        loss = F.mse_loss(model(x), y)
        grads = torch.autograd.grad(loss, params)
        total = [t + g for t, g in zip(total, grads, strict=True)]
        losses.append(loss.detach())
    for p, t in zip(params, total, strict=True):
        p.grad = t / case.world_size
    return losses


# -- what happened (parent side) -------------------------------------------------------------
Outcome = Literal["hang", "abort", "collective mismatch", "silent corruption", "completed", "error"]

#: A case that has not finished after this long is a hang. Longer than an MoE case needs on a
#: fresh pool (CUDA and NCCL start-up included), shorter than the pool's process-group timeout
#: (10 s), so the harness's deadline, not the collective library, is what detects it.
HANG_DEADLINE_S = 8.0

_FINGERPRINT = re.compile(
    r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=(\d+),? ?OpType=(\w+)"
    r"(?:, TensorShape=\[([^\]]*)\])?"
)


@dataclass(frozen=True)
class Classified:
    """A scenario's outcome class, what showed it, and per-rank collectives where known."""

    outcome: Outcome
    detail: str
    seconds: float
    collectives: tuple[dict[str, Any], ...] = ()


def classify(outcome: CaseOutcome, records: Sequence[dict[str, Any]]) -> Classified:
    """Names what a run did, from the pool's outcome and the comparison records.

    A deadline or a library timeout is a hang; a rank killed by a signal is an abort; the
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` wrapper's error is a collective mismatch (with each
    rank's operation, sequence number and shape); a run that finished with any comparison
    off the reference is silent corruption.
    """
    failure, secs = outcome.failure, outcome.seconds
    if failure is None:
        bad = [r for r in records if not r["passed"]]
        if not bad:
            return Classified("completed", f"{len(records)} comparisons, all equal to the reference", secs)
        worst = max(bad, key=lambda r: r["max_abs_diff"])
        return Classified(
            "silent corruption",
            f"every rank exited cleanly; {len(bad)} of {len(records)} comparisons differ from the reference, "
            f"worst {worst['tensor']} step {worst['step']} rank {worst['rank']}: max|diff| {worst['max_abs_diff']:.3g}",
            secs,
        )
    if failure.kind == "hang":
        return Classified("hang", f"{failure.message} ({secs:.1f} s); {_where(failure.stacks)}", secs)
    if failure.kind == "died":
        return Classified(
            "abort", f"rank {failure.rank} exit code {failure.exitcode}: {_reason(failure.message)}", secs
        )
    # Each rank's own error names its own collective first; what it says of its peer is
    # the wrapper's second-hand (and garbled) view, so only the first is kept.
    collectives = []
    for rank, text in [(failure.rank, failure.message), *failure.stacks.items()]:
        own = [m for m in _FINGERPRINT.findall(text) if int(m[0]) == rank][:1]
        collectives += [{"rank": rank, "sequence": int(seq), "op": op, "shape": shape} for _, seq, op, shape in own]
    if "Detected mismatch between collectives" in failure.message:
        named = "; ".join(f"rank {c['rank']}: #{c['sequence']} {c['op']} [{c['shape']}]" for c in collectives)
        return Classified("collective mismatch", named or _reason(failure.message), secs, tuple(collectives))
    if "Timed out" in failure.message or "timeout" in failure.message.lower():
        return Classified("hang", f"rank {failure.rank}: {_reason(failure.message)}", secs)
    return Classified("error", f"rank {failure.rank}: {_reason(failure.message)}", secs)


def _reason(text: str) -> str:
    """The line of a log or traceback that says why (the collective library's words)."""
    keys = ("Error", "error", "doesn't match", "mismatch", "Aborted", "timeout", "Timed out")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if any(k in ln for k in keys) and not ln.startswith("File "):
            return ln[:300]
    return lines[-1][:300] if lines else "no output"


def _where(stacks: Mapping[int, str]) -> str:
    """The innermost torch.distributed call each hung rank is in."""
    parts = []
    for rank, text in sorted(stacks.items()):
        frames = re.findall(r'File "[^"]*/torch/distributed/([^"]+)", line \d+ in (\w+)', text)
        parts.append(f"rank {rank} in {frames[0][1] if frames else 'unknown'}")
    return ", ".join(parts)
