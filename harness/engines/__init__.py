"""The engine contract: a sharding engine that takes the whole model and keeps the optimizer's
state itself, in flat buffers rather than DTensors (DeepSpeed's ZeRO), judged by the same
records as a candidate optimizer (``--engine MODULE:FACTORY``).

The factory builds the engine from the case's model, an ``EngineConfig`` and the case's
process group::

    from harness.engines import Engine, EngineConfig

    @Engine(stages={0, 1, 2, 3}, optimizers={"muon", "adamw"}, ...)
    def my_engine(model: nn.Module, config: EngineConfig, group) -> EngineRun: ...

and returns an ``EngineRun``: the harness drives forward (``run.module``), ``backward`` and
``step`` (after every micro-batch: the engine steps its optimizer at its own accumulation
boundary), and reads the full parameters and optimizer state through the engine's own API
(``full_param``, ``full_state``: collectives every rank calls, in the same order). It saves
and loads through the engine's own checkpoints (``save``, ``load``), and converts one for
another world size where the engine can (``Engine.reshard``).

What the engine declares about itself is one ``Engine`` (the fields are checked when it is
made; a bad one is a ``ValueError`` naming the field):

``stages``
    the sharding stages it takes (ZeRO's 0–3).
``optimizers``
    of ``muon`` (Muon with an auxiliary AdamW for what is not a hidden matrix) and ``adamw``.
``judged``
    per optimizer, what it is judged against: ``reference`` (muongate's ``reference.Muon`` or
    ``reference.AdamW``, bitwise) or ``self`` (``single_device``: the engine's own optimizer on
    one device, on the same parameters; for arithmetic the reference cannot take, such as a
    Newton–Schulz in fp16). Default: ``reference`` for both.
``single_device``
    ``single_device(named_params, config) -> torch.optim.Optimizer``: the engine's own optimizer
    on plain tensors of one device, for what is judged against ``self`` or ``shown``.
``conventions``
    ``conventions(config) -> {setting: value}``: the reference's settings that express the
    engine's arithmetic (``reference.Muon(ns_form="gram", ns_dtype=torch.float16, …)``), beside
    the case's ``lr``, ``weight_decay`` and ``momentum`` or ``betas`` and ``eps``; a case shows
    them. Where the engine's arithmetic is a setting of the reference, it is judged by something
    independent of it: a bug its own one-device optimizer shares is still seen.
``shown``
    the optimizers judged against the reference whose ``single_device`` is compared too and
    shown beside the verdict, not deciding it (``Comparison.against == "self"``).
``options``
    per optimizer, the engine's own settings beyond the common ones, each with the values a
    case draws (``{"muon": {"ns_method": ("gram", "standard")}}``); they reach the factory in
    ``EngineConfig.settings`` and ``conventions``, not the reference.
``accumulate``
    the gradient accumulation steps it takes (default 1, 2 and 4). The powers of two are judged
    on the exact and precision feeds; a count whose product with the world size is not a power
    of two (3, 5, 6) on the divisor witness (``harness.engines.case``).
``reduce_scatter``
    the stages at which it accepts a ``reduce_scatter`` setting, each with the values it
    accepts there (``{2: (True, False), 3: (True, False)}``); a key ``(optimizer, stage)``
    narrows one optimizer's (``("muon", 3): (False,)``).
``dtypes``
    parameter dtypes of ``float32`` and ``bfloat16``. A bf16 model keeps float32 master
    weights in the engine: ``full_param`` and ``full_state`` give those, and the one-device
    side steps float32 copies of the bf16 parameters.
``checkpoint``
    the stages whose ``save``/``load`` continue a run (default: all it takes).
``reshard``
    ``reshard(saved, out)`` converts the checkpoint ``save`` wrote into the directory ``saved``
    into one that ``load`` takes at any world size, in ``out`` (DeepSpeed's universal
    checkpoint), run once, on one process; ``reshard_stages`` and ``reshard_optimizers`` say
    where it applies.
``missing_gradient``
    what it does with a parameter that got no gradient: ``skip`` it (muongate's references:
    no decay, no state, no step counted; the default) or step it on ``zeros`` (DDP-style engines
    fill missing gradients with zeros before they reduce), which the one-device side then does too.
``differences``
    per optimizer (and ``"*"`` for all), short names of what the engine does otherwise than the
    side it is judged against, by design; every case names them (``EngineCase.describe``).
``clip``
    ``clip(config) -> form | None``: where the engine clips the gradients by their norm (the
    case's ``EngineConfig.clip``, a max norm), how it scales them by the norm it found
    (``reference.clipping.CLIP_FORMS``: ``"torch"`` multiplies by ``min(max / (norm + 1e-6), 1)``,
    ``"divide"`` divides by ``max((norm + 1e-6) / max, 1)``), or ``None`` for a config whose
    norm it cannot report (that cell skips, naming why). Its run then has ``grad_norm()``: the norm
    its last step clipped by, a tensor in the dtype it was summed in. Without ``clip`` the
    clipping cells skip.
``per_head``
    the Muon setting that turns its per-head Newton–Schulz on (DeepSpeed's ``per_head_muon``), or
    ``None``. The per-head gate then sets it in ``EngineConfig.settings``, and the model's first
    matrix is a query projection, ``q_proj.weight``, of ``heads`` heads, which the model's
    ``config`` describes (``num_attention_heads``, ``head_dim``) as a transformer's does; the
    reference orthogonalizes that matrix per head (``ns_heads``) and every other whole.
``needs_every_grad``
    ``needs_every_grad(config) -> bool``: the configs under which the engine needs a gradient for
    every parameter at every step (Megatron's ``overlap_grad_reduce`` asserts it); their cases
    give every parameter one, and say so. Default: none.
``needs_same_grads``
    ``needs_same_grads(config) -> bool``: the configs under which every rank's loss must reach
    the same parameters (DeepSpeed's ZeRO 1–3, whose reduction buckets follow the gradients each
    rank produced); a parameter without a gradient on every rank alike is still taken. Their
    rank-asymmetric cases (``EngineCase.missing_on``) give the parameter its gradient on every
    rank, and say so. Default: none.
``package``
    the package it drives (``"deepspeed==0.19.8"``): the matrix names it, and a gate session
    whose machine lacks it refuses the engine in one line (``LoadedEngine.refusal``).
``devices``
    where its ranks can run, of ``{"cpu", "cuda"}`` (default both; Megatron-core's
    ``{"cuda"}``): a session on another device refuses it in one line.

Every rank builds the same model from the case's seed; the engine is free to broadcast it.
An engine talks over the default process group (DeepSpeed's ``deepspeed.comm`` does): its
cases run on every rank of the pool, and ``group`` is that whole group.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from torch import Tensor, nn

from harness.algorithms import engine_names

F = TypeVar("F")

#: the optimizers an engine may declare: the names muongate's algorithm families declare (``ENGINE_NAME``)
OPTIMIZERS = engine_names()
DTYPES = frozenset({"float32", "bfloat16"})
JUDGED = frozenset({"reference", "self"})

#: the attribute a declaration is kept in on its factory
ATTRIBUTE = "muongate_engine"


@dataclass(frozen=True)
class EngineConfig:
    """What one case asks of the engine."""

    optimizer: str
    stage: int
    accumulate: int
    #: ``None``: the engine's own default
    reduce_scatter: bool | None
    dtype: str
    #: the optimizer's settings: ``lr``, ``weight_decay``, and ``momentum`` (Muon) or ``betas``, ``eps`` (AdamW)
    settings: tuple[tuple[str, Any], ...]
    #: the max norm the gradients are clipped to before each step (0: none; ``Engine.clip``)
    clip: float = 0.0

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.settings)


class EngineRun(Protocol):
    """One engine, built on one model, on this rank."""

    @property
    def module(self) -> nn.Module:
        """What the harness calls forward on."""
        ...

    def backward(self, loss: Tensor) -> None:
        """Backward of one micro-batch's loss (the engine scales it for accumulation)."""
        ...

    def step(self) -> None:
        """After every micro-batch; the engine steps its optimizer at its accumulation boundary."""
        ...

    def full_param(self, name: str) -> Tensor:
        """The whole parameter ``name`` (its float32 master where the engine keeps one); a collective."""
        ...

    def full_state(self, name: str) -> Mapping[str, Tensor]:
        """The whole optimizer state of ``name``, by the reference's names; a collective."""
        ...

    def save(self, path: str) -> None:
        """The engine's own checkpoint, into the directory ``path`` (shared by the ranks); a collective."""
        ...

    def load(self, path: str) -> None:
        """Loads a checkpoint ``save`` (or ``Engine.reshard``) wrote; a collective."""
        ...


@dataclass(frozen=True)
class Engine:
    """What an engine declares about itself (see the module docstring)."""

    stages: Iterable[int]
    optimizers: Iterable[str] = OPTIMIZERS
    judged: Mapping[str, str] = field(default_factory=dict)
    single_device: Callable[..., Any] | None = None
    conventions: Callable[[EngineConfig], Mapping[str, Any]] | None = None
    shown: Iterable[str] = frozenset()
    options: Mapping[str, Mapping[str, Iterable[Any]]] = field(default_factory=dict)
    accumulate: Iterable[int] = (1, 2, 4)
    reduce_scatter: Mapping[Any, Iterable[bool]] = field(default_factory=dict)
    dtypes: Iterable[str] = frozenset({"float32"})
    checkpoint: Iterable[int] | None = None
    reshard: Callable[..., Any] | None = None
    reshard_stages: Iterable[int] = frozenset()
    reshard_optimizers: Iterable[str] = frozenset()
    missing_gradient: str = "skip"
    differences: Mapping[str, Iterable[str]] = field(default_factory=dict)
    per_head: str | None = None
    clip: Callable[[EngineConfig], str | None] | None = None
    needs_every_grad: Callable[[EngineConfig], bool] | None = None
    needs_same_grads: Callable[[EngineConfig], bool] | None = None
    package: str | None = None
    devices: Iterable[str] = frozenset({"cpu", "cuda"})

    def __post_init__(self) -> None:
        put = object.__setattr__
        put(self, "devices", _names("devices", self.devices, frozenset({"cpu", "cuda"})))
        if not self.devices:
            raise ValueError("Engine devices=set(): where its ranks can run, e.g. devices={'cuda'}")
        put(self, "stages", tuple(sorted(set(self.stages))))
        if not self.stages or any(not isinstance(s, int) or s < 0 for s in self.stages):
            raise ValueError(f"Engine stages={self.stages!r}: whole numbers ≥ 0, e.g. stages={{0, 1, 2, 3}}")
        put(self, "optimizers", _names("optimizers", self.optimizers, OPTIMIZERS))
        judged = {o: self.judged.get(o, "reference") for o in self.optimizers}
        bad = {o: j for o, j in judged.items() if j not in JUDGED}
        if bad or set(self.judged) - set(self.optimizers):
            raise ValueError(f"Engine judged={dict(self.judged)!r}: per declared optimizer, one of {sorted(JUDGED)}")
        put(self, "judged", judged)
        if "self" in judged.values() and not callable(self.single_device):
            raise ValueError("Engine judged=…'self': name the engine's own one-device optimizer, single_device=…")
        put(self, "shown", _names("shown", self.shown, frozenset(self.optimizers)))
        if self.shown and not callable(self.single_device):
            raise ValueError("Engine shown=…: name the engine's own one-device optimizer, single_device=…")
        if any(judged[o] != "reference" for o in self.shown):  # type: ignore[attr-defined]
            raise ValueError(f"Engine shown={sorted(self.shown)!r}: only optimizers judged against the reference")
        if self.conventions is not None and not callable(self.conventions):
            raise ValueError("Engine conventions=…: a function of the EngineConfig")
        options = {o: {k: tuple(v) for k, v in own.items()} for o, own in self.options.items()}
        if set(options) - set(self.optimizers) or any(not v for own in options.values() for v in own.values()):
            raise ValueError(f"Engine options={dict(self.options)!r}: per declared optimizer, settings with values")
        put(self, "options", options)
        put(self, "accumulate", tuple(sorted(set(self.accumulate))))
        if not self.accumulate or any(not isinstance(a, int) or a < 1 for a in self.accumulate):
            raise ValueError(f"Engine accumulate={self.accumulate!r}: whole numbers ≥ 1, e.g. accumulate=(1, 2, 4)")
        scatter = {k: tuple(sorted(set(v))) for k, v in self.reduce_scatter.items()}
        stages = {k[1] if isinstance(k, tuple) else k for k in scatter}
        if stages - set(self.stages) or any(not v for v in scatter.values()):
            raise ValueError(f"Engine reduce_scatter={dict(self.reduce_scatter)!r}: declared stages, each with values")
        put(self, "reduce_scatter", scatter)
        put(self, "dtypes", _names("dtypes", self.dtypes, DTYPES))
        put(self, "checkpoint", self.stages if self.checkpoint is None else tuple(sorted(set(self.checkpoint))))
        put(self, "reshard_stages", tuple(sorted(set(self.reshard_stages))))
        put(self, "reshard_optimizers", _names("reshard_optimizers", self.reshard_optimizers, OPTIMIZERS))
        if self.reshard is None and (self.reshard_stages or self.reshard_optimizers):
            raise ValueError("Engine reshard_stages/reshard_optimizers: declare the conversion too, reshard=…")
        if self.missing_gradient not in ("skip", "zeros"):
            raise ValueError(f"Engine missing_gradient={self.missing_gradient!r}: 'skip' or 'zeros'")
        put(self, "differences", {k: tuple(v) for k, v in self.differences.items()})
        if self.clip is not None and not callable(self.clip):
            raise ValueError(f"Engine clip={self.clip!r}: a function of the case's config, e.g. clip=lambda c: 'torch'")
        for name in ("needs_every_grad", "needs_same_grads"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise ValueError(f"Engine {name}={getattr(self, name)!r}: a function of the case's config")
        if self.per_head is not None and (not isinstance(self.per_head, str) or "muon" not in self.optimizers):
            raise ValueError(f"Engine per_head={self.per_head!r}: the name of its Muon setting, and declare muon")

    def __call__(self, factory: F) -> F:
        """Declares this on ``factory`` and returns it: ``@Engine(...)`` or ``Engine(...)(factory)``."""
        setattr(factory, ATTRIBUTE, self)
        return factory

    def scatter_of(self, optimizer: str, stage: int) -> tuple[bool, ...] | None:
        """The ``reduce_scatter`` values ``optimizer`` takes at ``stage``; ``None``: no such setting."""
        scatter = self.reduce_scatter
        found = scatter.get((optimizer, stage), scatter.get(stage))
        return None if found is None else tuple(found)

    def differences_of(self, optimizer: str) -> tuple[str, ...]:
        return (*self.differences.get("*", ()), *self.differences.get(optimizer, ()))


def _names(field_name: str, value: Iterable[str], known: frozenset[str]) -> frozenset[str]:
    if isinstance(value, str):
        raise ValueError(f"Engine {field_name}={value!r}: a set of names, e.g. {field_name}={{{value!r}}}")
    chosen = frozenset(value)
    if chosen - known:
        raise ValueError(f"Engine {field_name}: unknown {sorted(chosen - known)}; choose from {sorted(known)}")
    return chosen


@dataclass(frozen=True)
class LoadedEngine:
    """An ``--engine MODULE:FACTORY``, imported and with its declaration."""

    spec: str
    factory: Callable[..., EngineRun]
    declared: Engine

    @classmethod
    def load(cls, spec: str) -> LoadedEngine:
        """Imports ``spec``; an error names what is wrong with it."""
        module_name, sep, attr = spec.partition(":")
        if not sep or not module_name or not attr:
            raise ValueError(f"--engine {spec}: expected MODULE:FACTORY")
        factory = getattr(importlib.import_module(module_name), attr)
        declared = getattr(factory, ATTRIBUTE, None)
        if not isinstance(declared, Engine):
            raise TypeError(
                f"--engine {spec}: {attr} declares no harness.engines.Engine; decorate it with @Engine(stages=…)"
            )
        return cls(spec, factory, declared)

    def refusal(self, device: str) -> str | None:
        """Why a gate session with ranks on ``device`` cannot run this engine (one line), or ``None``:
        the package it drives is not installed, or it does not run on ``device``."""
        from importlib.metadata import PackageNotFoundError, version

        package = self.declared.package
        if package is not None and "==" in package:  # a distribution (muongate's own engine names a file)
            name = package.split("==")[0].strip()
            try:
                version(name)
            except PackageNotFoundError:
                return f"drives {package}, which is not installed here: pip install '{package}' (docs/pages/engines.md)"
        if device not in self.declared.devices:
            where = " and ".join(sorted(self.declared.devices))
            return f"runs its ranks on {where} only, and this session's are on {device}: try --gate-device {where}"
        return None
