"""muongate's own small engine (``harness.engines``), a ZeRO-1 in miniature, and the three
planted bugs the engine gates must catch (their negative controls).

It keeps every parameter's float32 master in one flat order and splits that order evenly
over the ranks, so a matrix can straddle two partitions. The rank whose partition holds a
parameter's first element owns it: it keeps its optimizer state (``reference.Muon``, or
``reference.AdamW``) and steps it on the whole matrix's all-reduced gradient, then broadcasts
the new values to the others. Gradients accumulate in ``.grad`` over micro-batches; the
optimizer steps once per ``accumulate`` of them.

The planted bugs, each a sharding mistake engines have made:

``sliced_engine``
    orthogonalizes each partition's rows of a straddling matrix alone, instead of the whole matrix;
``per_micro_batch_engine``
    steps once per micro-batch instead of once per accumulation boundary;
``partly_reduced_engine``
    the owner of a straddling matrix takes the all-reduced gradient only for its own
    partition's elements, and its own rank's unreduced gradient for the rest;
``lossy_reshard_engine``
    converts a checkpoint for another world size (``flat_reshard``) without its optimizer state;
``owner_skips_engine``
    the owner skips a parameter that has no gradient on its own rank, though other ranks' do:
    only the rank-asymmetric feed sees it (``harness.engines.case``);
``bf16_reduced_engine``
    all-reduces the float32 gradients in bf16 (a reduction narrower than the declared dtype, as
    2026's reports against frameworks' mixed-precision policies say): only the precision
    witness feed sees it (``harness.engines.case``).

Its checkpoints are a file per rank; ``flat_reshard`` merges them into one that any world
size loads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

import reference
from harness.engines import Engine, EngineConfig
from harness.tasks.engine import reference_optimizer

PACKAGE = "muongate (gates/examples/flat_engine.py)"


class FlatRun:
    """One flat engine on this rank (``harness.engines.EngineRun``)."""

    def __init__(self, model: nn.Module, config: EngineConfig, group: Any, bug: str | None = None) -> None:
        self.module, self.config, self.group, self.bug = model, config, group, bug
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.params = dict(model.named_parameters())
        self.masters = {n: nn.Parameter(p.detach().float().clone()) for n, p in self.params.items()}
        sizes = [p.numel() for p in self.params.values()]
        self.offsets = dict(zip(self.params, [sum(sizes[:i]) for i in range(len(sizes))], strict=True))
        self.part = max(1, math.ceil(sum(sizes) / self.world))
        self.owner = {n: min(self.offsets[n] // self.part, self.world - 1) for n in self.params}
        self.optimizers = {n: self._optimizer(n) for n in self.params if self.owner[n] == self.rank}
        self.micro = 0

    def _optimizer(self, name: str) -> torch.optim.Optimizer:
        if self.bug != "sliced" or self.config.optimizer != "muon" or self.masters[name].ndim < 2:
            return reference_optimizer([(name, self.masters[name])], self.config.optimizer, self.config.options)
        rows = self._rows_in_partition(name)
        optimizer = reference_optimizer([(name, self.masters[name])], "muon", self.config.options)
        optimizer.orthogonalize_fn = _sliced(rows)  # type: ignore[attr-defined]
        return optimizer

    def _rows_in_partition(self, name: str) -> int:
        """How many leading rows of ``name`` start in its owner's partition."""
        end = (self.owner[name] + 1) * self.part - self.offsets[name]
        cols = self.masters[name].shape[1]
        return max(1, min(self.masters[name].shape[0], math.ceil(end / cols)))

    def backward(self, loss: Tensor) -> None:
        accumulate = self.config.accumulate
        if self.bug == "shifted_divisor":  # the count rounded down to a power of two, as a shift divides
            accumulate = 1 << (accumulate.bit_length() - 1)
        (loss / accumulate).backward()

    def step(self) -> None:
        self.micro += 1
        if self.bug == "per_micro" or self.micro % self.config.accumulate == 0:
            self._step()

    def _step(self) -> None:
        grads = {n: p.grad for n, p in self.params.items()}
        # each parameter's gradient, zeros where this rank has none, then whether it has one: a
        # parameter is stepped where any rank had a gradient (the mean counts the others' as zeros)
        local = torch.cat([(g if g is not None else torch.zeros_like(p)).float().flatten() for (n, p), g in
                           zip(self.params.items(), grads.values(), strict=True)]
                          + [torch.tensor([float(g is not None) for g in grads.values()])])  # fmt: skip
        if self.bug == "bf16_reduced":  # the all-reduce carried in bf16, its result widened again
            narrow = local.to(torch.bfloat16)
            dist.all_reduce(narrow, group=self.group)
            reduced = narrow.float()
        else:
            reduced = local.clone()
            dist.all_reduce(reduced, group=self.group)
        had = dict(zip(grads, (reduced[-len(grads) :] > 0).tolist(), strict=True))
        reduced /= self.world
        for name, optimizer in self.optimizers.items():
            if not had[name] or (self.bug == "owner_skips" and grads[name] is None):
                continue
            start, numel = self.offsets[name], self.masters[name].numel()
            grad = reduced[start : start + numel].clone()
            if self.bug == "partly_reduced":
                mine = torch.arange(start, start + numel) // self.part == self.rank
                grad = torch.where(mine, grad, local[start : start + numel])
            self.masters[name].grad = grad.view_as(self.masters[name])
            optimizer.step()
            self.masters[name].grad = None
        for name, p in self.params.items():
            dist.broadcast(self.masters[name].data, src=self._global(self.owner[name]), group=self.group)
            with torch.no_grad():
                p.copy_(self.masters[name])
            p.grad = None

    def _global(self, rank: int) -> int:
        return dist.get_global_rank(self.group, rank)

    def full_param(self, name: str) -> Tensor:
        return self.masters[name].detach().clone()

    def full_state(self, name: str) -> Mapping[str, Tensor]:
        owned = self.optimizers.get(name)
        state: list[Any] = [dict(owned.state.get(self.masters[name], {})) if owned is not None else None]
        dist.broadcast_object_list(state, src=self._global(self.owner[name]), group=self.group)
        return {k: v for k, v in state[0].items() if torch.is_tensor(v)}

    def save(self, path: str) -> None:
        saved = {
            "masters": {n: m.detach() for n, m in self.masters.items()},
            "optimizers": {n: o.state_dict() for n, o in self.optimizers.items()},
            "micro": self.micro,
        }
        Path(path).mkdir(parents=True, exist_ok=True)
        torch.save(saved, Path(path, f"rank{self.rank}.pt"))
        dist.barrier(group=self.group)

    def load(self, path: str) -> None:
        merged = Path(path, MERGED)
        saved = torch.load(merged if merged.exists() else Path(path, f"rank{self.rank}.pt"), weights_only=True)
        with torch.no_grad():
            for name, master in self.masters.items():
                master.copy_(saved["masters"][name])
                self.params[name].copy_(master)
        for name, optimizer in self.optimizers.items():
            if name in saved["optimizers"]:
                optimizer.load_state_dict(saved["optimizers"][name])
        self.micro = saved["micro"]


#: the one file a resharded checkpoint is (``flat_reshard``)
MERGED = "merged.pt"


def flat_reshard(saved: str, out: str, *, keep_state: bool = True) -> None:
    """Every rank's file merged into one that any world size loads: the masters (the same on
    every rank) and each parameter's optimizer state from its owner."""
    files = [torch.load(f, weights_only=True) for f in sorted(Path(saved).glob("rank*.pt"))]
    merged = {
        "masters": files[0]["masters"],
        "optimizers": {n: o for f in files for n, o in f["optimizers"].items()} if keep_state else {},
        "micro": files[0]["micro"],
    }
    Path(out).mkdir(parents=True, exist_ok=True)
    torch.save(merged, Path(out, MERGED))


def lossy_reshard(saved: str, out: str) -> None:
    """The planted bug: a conversion that keeps the parameters and drops the optimizer state."""
    flat_reshard(saved, out, keep_state=False)


def _sliced(rows: int) -> Callable[..., Tensor]:
    """Orthogonalizes the first ``rows`` rows and the rest each on its own (the planted bug)."""

    def orthogonalize(G: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        if rows >= G.shape[0]:
            return reference.orthogonalize(G, *args, **kwargs)
        return torch.cat([reference.orthogonalize(piece, *args, **kwargs) for piece in (G[:rows], G[rows:])])

    return orthogonalize


DECLARED = Engine(
    stages={1},
    dtypes={"float32", "bfloat16"},
    accumulate=(1, 2, 3, 4),
    reshard=flat_reshard,
    reshard_stages={1},
    reshard_optimizers={"muon", "adamw"},
    package=PACKAGE,
)


@DECLARED
def flat_engine(model: nn.Module, config: EngineConfig, group: Any) -> FlatRun:
    """The correct flat engine."""
    return FlatRun(model, config, group)


@replace(DECLARED, optimizers={"muon"}, judged={})
def sliced_engine(model: nn.Module, config: EngineConfig, group: Any) -> FlatRun:
    return FlatRun(model, config, group, bug="sliced")


@replace(DECLARED, optimizers={"muon"}, judged={}, accumulate=(2, 4))
def per_micro_batch_engine(model: nn.Module, config: EngineConfig, group: Any) -> FlatRun:
    return FlatRun(model, config, group, bug="per_micro")


@replace(DECLARED, optimizers={"muon"}, judged={})
def partly_reduced_engine(model: nn.Module, config: EngineConfig, group: Any) -> FlatRun:
    return FlatRun(model, config, group, bug="partly_reduced")


@replace(DECLARED, reshard=lossy_reshard)
def lossy_reshard_engine(model: nn.Module, config: EngineConfig, group: Any) -> FlatRun:
    return FlatRun(model, config, group)


@replace(DECLARED, judged={})
def owner_skips_engine(model: nn.Module, config: EngineConfig, group: Any) -> FlatRun:
    return FlatRun(model, config, group, bug="owner_skips")


@replace(DECLARED, judged={})
def bf16_reduced_engine(model: nn.Module, config: EngineConfig, group: Any) -> FlatRun:
    return FlatRun(model, config, group, bug="bf16_reduced")


@replace(DECLARED, optimizers={"muon"}, judged={})
def shifted_divisor_engine(model: nn.Module, config: EngineConfig, group: Any) -> FlatRun:
    return FlatRun(model, config, group, bug="shifted_divisor")


#: the planted engines the gates must catch on the exact feed, by name
CONTROLS = {f.__name__: f for f in (sliced_engine, per_micro_batch_engine, partly_reduced_engine)}
