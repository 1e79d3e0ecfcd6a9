"""A training case's step around the optimizer, as FSDP2 runs it and as one device follows it.

A case declares what its step computes and reduces in (``Precision``: FSDP2's
``MixedPrecisionPolicy`` and ``torch.autocast``), how it accumulates micro-batches
(``Accumulation``: how many, and when FSDP2 reduces them) and over which ranks (a 1-D mesh,
or HSDP's ``(replicate, shard)`` mesh). The sharded side lays its model out and steps as
declared. The one-device side follows the *declaration*, not the layout
(``one_device_gradients``): each micro-batch's forward and backward on a copy of its
parameters cast to the declared dtype, each gradient cast to the reduce dtype, then the same
tree of means FSDP2 takes, in the order the declared accumulation takes it: within each
replica's shard group in rank order, then across replicas, before or after summing the
micro-batches. So a layout that reduces in another dtype, over another group or by another
divisor than it declares differs from the one-device step, which cannot share the mistake.

A mean of two values, rounded once and halved, does not depend on their order, so wherever
every level of the tree has at most two ranks (2 ranks; HSDP on 2 × 2) the step is bitwise.

A case also declares its learning-rate schedule and whether the sharded side resumes
(``Resume``): after a step it saves its model and optimizer with DCP and its schedule's
``state_dict``, loads them into a fresh model laid out again, a fresh optimizer and a fresh
schedule, and trains on, while one device trains straight through on the same schedule.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Precision:
    """What a training step computes in (module docstring); every field ``None``: the
    parameters' own dtype throughout, no autocast (FSDP2's default)."""

    #: FSDP2's ``param_dtype``: the gathered parameters, forward and backward
    param: str | None = None
    #: FSDP2's ``reduce_dtype`` (``None``: ``param``'s, FSDP2's default); micro-batches
    #: accumulate in it too
    reduce: str | None = None
    #: ``torch.autocast``'s dtype around the forward, on the ranks' device
    autocast: str | None = None

    def __post_init__(self) -> None:
        for name in ("param", "reduce", "autocast"):
            value = getattr(self, name)
            if value is not None and value not in DTYPES:
                raise ValueError(f"Precision {name}={value!r}: one of {sorted(DTYPES)} or None")
        if self.reduce is not None and self.param is None:
            raise ValueError(
                f"Precision reduce={self.reduce!r} without param: FSDP2 reduces in the parameters' own dtype "
                "unless a param dtype is declared"
            )

    @property
    def mixed(self) -> bool:
        return any((self.param, self.reduce, self.autocast))

    def policy(self) -> Any:
        """FSDP2's ``MixedPrecisionPolicy`` of this declaration."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=_dtype(self.param), reduce_dtype=_dtype(self.reduce))

    @contextlib.contextmanager
    def forward(self, device: torch.device) -> Iterator[None]:
        """Where a forward runs: under ``torch.autocast`` on ``device`` if declared."""
        if self.autocast is None:
            yield
            return
        with torch.autocast(device.type, dtype=DTYPES[self.autocast]):
            yield

    def computed_on(self, model: nn.Module) -> nn.Module:
        """The model a one-device forward runs: ``model`` itself, or a copy cast to ``param``."""
        return model if self.param is None else copy.deepcopy(model).to(DTYPES[self.param])

    def reduced_in(self, param: Tensor) -> torch.dtype:
        """The dtype ``param``'s gradients are reduced and accumulated in."""
        name = self.reduce or self.param
        return param.dtype if name is None else DTYPES[name]

    def describe(self) -> str:
        if not self.mixed:
            return "the parameters' dtype throughout"
        parts = []
        if self.param is not None:
            parts.append(f"{self.param} params, {self.reduce or self.param} reduce (FSDP2 MixedPrecisionPolicy)")
        if self.autocast is not None:
            parts.append(f"{self.autocast} autocast")
        return ", ".join(parts)

    def clause(self) -> str:
        """``", " + describe()`` where mixed, for a case's description; else nothing."""
        return f", {self.describe()}" if self.mixed else ""


#: FSDP2's default: no mixed precision
FULL = Precision()

#: when FSDP2 reduces a step's micro-batches (``Accumulation.sync``)
SYNCS = {
    "every": "every micro-batch's backward reduces (FSDP2's default)",
    "last": "set_requires_gradient_sync(False) before all but the last micro-batch: each rank accumulates "
    "its gradients unreduced, the last backward reduces their sum",
    "last_all_reduce": "HSDP: set_requires_all_reduce(False) before all but the last micro-batch: each "
    "reduce-scatters within its replica, the all-reduce across replicas waits for the last",
}


@dataclass(frozen=True)
class Accumulation:
    """How a step accumulates: ``micro_batches`` backward passes, each of a loss divided by
    their number, and when FSDP2 reduces them (``sync``, one of ``SYNCS``)."""

    micro_batches: int = 1
    sync: str = "every"

    def __post_init__(self) -> None:
        if self.micro_batches < 1:
            raise ValueError(f"Accumulation micro_batches={self.micro_batches}: at least 1")
        if self.sync not in SYNCS:
            raise ValueError(f"Accumulation sync={self.sync!r}: one of {sorted(SYNCS)}")

    def before(self, model: nn.Module, micro: int) -> None:
        """Sets the FSDP2 model's reductions for micro-batch ``micro`` of a step."""
        last = micro == self.micro_batches - 1
        if self.sync == "last":
            model.set_requires_gradient_sync(last)  # type: ignore[operator]
        elif self.sync == "last_all_reduce":
            model.set_requires_all_reduce(last)  # type: ignore[operator]

    def scaled(self, loss: Tensor) -> Tensor:
        return loss if self.micro_batches == 1 else loss / self.micro_batches

    def describe(self) -> str:
        if self.micro_batches == 1:
            return "one micro-batch a step"
        return f"{self.micro_batches} micro-batches a step, reduced {self.sync}"

    def clause(self) -> str:
        """``", " + describe()`` where it accumulates, for a case's description; else nothing."""
        return f", {self.describe()}" if self.micro_batches > 1 else ""


ONE = Accumulation()


#: the learning-rate schedules a case may declare: the factor of the declared learning rate at
#: each step (``torch.optim.lr_scheduler.LambdaLR``); Python floats, the same on both sides
SCHEDULES: dict[str, Callable[[int], float]] = {
    "constant": lambda step: 1.0,
    # two steps of warm-up, then halved each step
    "warmup_decay": lambda step: min(1.0, (step + 1) / 2) * 0.5 ** max(0, step - 1),
    # an eighth less each step
    "linear_decay": lambda step: max(0.0, 1.0 - step / 8),
}


@dataclass(frozen=True)
class Resume:
    """A case's learning-rate schedule (one of ``SCHEDULES``, stepped after every optimizer
    step; ``adamw_schedule``: another for the AdamW groups, a schedule per group as
    torchtitan and Megatron give their embeddings and norms) and, where ``after`` > 0, the
    sharded side's resume after that many steps; ``world``: on that many of its ranks (0: all),
    the data of the ranks left out no longer in the step, on either side (an elastic restart
    on fewer hosts). ``no_decay``: parameters, by a part of their name, that take no weight
    decay (a group of their own with ``weight_decay`` and ``adamw_weight_decay`` 0, as users
    mask norms and embeddings)."""

    schedule: str = "constant"
    after: int = 0
    adamw_schedule: str | None = None
    no_decay: tuple[str, ...] = ()
    world: int = 0

    def __post_init__(self) -> None:
        for field_name in ("schedule", "adamw_schedule"):
            named = getattr(self, field_name)
            if named is not None and named not in SCHEDULES:
                raise ValueError(f"Resume {field_name}={named!r}: one of {sorted(SCHEDULES)}")
        if self.after < 0:
            raise ValueError(f"Resume after={self.after}: a number of steps, 0 for none")
        if isinstance(self.no_decay, str) or not all(isinstance(n, str) and n for n in self.no_decay):
            raise ValueError(f"Resume no_decay={self.no_decay!r}: a tuple of parts of parameter names")
        if self.world < 0 or (self.world and not self.after):
            raise ValueError(f"Resume world={self.world}: the ranks a resume continues on, with after > 0 (0: all)")

    def on(self, opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR | None:
        """The schedule, on ``opt``'s every param group (an AdamW group, ``use_muon`` False, on
        ``adamw_schedule`` where there is one); ``None`` where the case declares neither a
        schedule nor a resume (no scheduler touches its optimizers)."""
        if self == THROUGH:
            return None
        adamw = self.adamw_schedule or self.schedule
        factors = [SCHEDULES[self.schedule if g.get("use_muon", True) else adamw] for g in opt.param_groups]
        return torch.optim.lr_scheduler.LambdaLR(opt, factors)

    def masked(self, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``groups`` (each with its ``param_names``) with the parameters ``no_decay`` names moved
        into a group of their own beside each, which decays nothing."""
        if not self.no_decay:
            return groups
        out = []
        for group in groups:
            named = list(zip(group["param_names"], group["params"], strict=True))
            for masked in (False, True):
                kept = [(n, p) for n, p in named if any(part in n for part in self.no_decay) == masked]
                if kept:
                    decay = {"weight_decay": 0.0, "adamw_weight_decay": 0.0} if masked else {}
                    out.append({**group, "params": [p for _, p in kept], "param_names": [n for n, _ in kept], **decay})
        return out

    def clause(self) -> str:
        """``", " + what it declares`` where it declares anything; else nothing."""
        parts = [f"{self.schedule} schedule"] if self.schedule != "constant" else []
        parts += [f"AdamW on a {self.adamw_schedule} schedule"] if self.adamw_schedule else []
        parts += [f"no decay for {', '.join(self.no_decay)}"] if self.no_decay else []
        parts += [f"resumed after step {self.after}"] if self.after else []
        parts += [f"on {self.world} rank{'s' if self.world != 1 else ''}"] if self.world else []
        return "".join(f", {part}" for part in parts)


THROUGH = Resume()


def resume_of(spec: Any) -> Resume:
    """A training spec's declared schedule and resume (``THROUGH``: constant, no resume)."""
    return getattr(spec, "resume", THROUGH)


def precision_of(spec: Any) -> Precision:
    """A training spec's declared precision (``FULL`` where it declares none)."""
    return getattr(spec, "precision", FULL)


def accumulation_of(spec: Any) -> Accumulation:
    """A training spec's declared accumulation (``ONE`` where it declares none)."""
    return getattr(spec, "accumulation", ONE)


def replicas_of(spec: Any) -> int:
    """HSDP's replicas of a training spec (1: FSDP2 on a 1-D mesh)."""
    return int(getattr(spec, "replicate", 1))


def one_device_gradients(
    grads: Sequence[Sequence[Sequence[Tensor | None]]], params: Sequence[Tensor], spec: Any
) -> list[Tensor]:
    """Each parameter's gradient as the spec's declared step reduces it (module docstring):
    ``grads[rank][micro][i]`` is the gradient of parameter ``i`` in that rank's micro-batch (or
    ``None``: it counts as zeros). Cast to the reduce dtype, the mean taken within each
    replica's shard group and then across replicas, before the micro-batches are summed
    (``every``: the sum then in the parameter's dtype, as FSDP2 adds a step's reduced
    gradients), after (``last``), or between (``last_all_reduce``), then cast to the
    parameter's dtype."""
    precision, accumulation, replicas = precision_of(spec), accumulation_of(spec), replicas_of(spec)
    shard = len(grads) // replicas
    micros = range(accumulation.micro_batches)
    out = []
    for i, p in enumerate(params):
        dtype = precision.reduced_in(p)

        def at(rank: int, micro: int, i: int = i, dtype: torch.dtype = dtype) -> Tensor | None:
            g = grads[rank][micro][i]
            return None if g is None else g.to(dtype)

        def replica(r: int) -> range:
            return range(r * shard, (r + 1) * shard)

        if accumulation.sync == "every":
            means = [_tree([[at(k, m) for k in replica(r)] for r in range(replicas)]) for m in micros]
            total = _sum(None if g is None else g.to(p.dtype) for g in means)
        elif accumulation.sync == "last":
            total = _tree([[_sum(at(k, m) for m in micros) for k in replica(r)] for r in range(replicas)])
        else:
            partial = [_sum(_mean([at(k, m) for k in replica(r)]) for m in micros) for r in range(replicas)]
            total = _mean(partial)
        out.append(torch.zeros_like(p) if total is None else total.to(p.dtype))
    return out


def _sum(values: Any) -> Tensor | None:
    """Left to right, from the first value (a sum from zeros would turn ``-0.0`` into ``+0.0``)."""
    total = None
    for v in values:
        if v is not None:
            total = v if total is None else total + v
    return total


def _mean(values: list[Tensor | None]) -> Tensor | None:
    total = _sum(values)
    return None if total is None else total / len(values)


def _tree(groups: list[list[Tensor | None]]) -> Tensor | None:
    """The mean within each group, then across the groups' means."""
    return _mean([_mean(g) for g in groups])


def _dtype(name: str | None) -> torch.dtype | None:
    return None if name is None else DTYPES[name]
