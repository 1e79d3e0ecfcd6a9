"""What one example is: a ``Case`` for the optimizer gates, a ``KernelCase`` for the kernel gates.

A case is a frozen, picklable record with a seed and never a tensor: every rank builds
the same tensors from it (``harness.cases.tensors``). ``describe()`` names what differs
from the defaults, e.g. ``w0[4, 4] float32 · world 2 · 1 step · weight_decay=0.1``, which
is what a reader of a minimal failing case needs to see.

A candidate travels in a case as the factory object itself (pickled by reference, so the
rank imports its module), never as an import string; ``None`` is the built-in
``distributed_impl.ShardedMuon``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple, Protocol

from harness import layouts
from harness.layouts import Layout

DType = Literal["float32", "bfloat16"]
#: ``late``: no gradient on the first step, then one on every step (a layer unfrozen, an expert
#: that gets tokens later): a parameter whose own step count trails the optimizer's
GradKind = Literal["normal", "zero", "none", "every_other", "late", "norm_boundary", "rank_asymmetric"]
Mode = Literal["all_ranks", "owner_split"]
#: how a matrix is laid out under tensor parallelism (``Case.tp > 1``): ``parallelize_module``'s
#: ``ColwiseParallel`` (``Shard(0)``) or ``RowwiseParallel`` (``Shard(1)``), or replicated
Style = Literal["colwise", "rowwise", "replicate"]
KernelInput = Literal["gaussian", "spectrum", "zero", "rank_deficient", "huge", "tiny", "nan", "inf"]


def candidate_name(candidate: Any, reference: Any) -> str:
    """``module:name`` of a candidate factory; ``None``: the one muongate ships for the family of
    ``reference`` (a reference class, as ``Case.reference``; ``harness.algorithms.built_in``)."""
    if candidate is None:
        from harness.algorithms import built_in, family_of

        return built_in(family_of(reference))
    return f"{candidate.__module__}:{getattr(candidate, '__qualname__', type(candidate).__qualname__)}"


def stored_setting(key: str, value: Any) -> Any:
    """A setting as cases store it: ``ns_dtype`` by name (``"bfloat16"``), everything else as is."""
    return str(value).removeprefix("torch.") if key == "ns_dtype" else value


def optimizer_settings(settings: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """Stored settings as optimizer keywords: the one place ``ns_dtype`` becomes a ``torch.dtype``."""
    import torch

    out = dict(settings)
    if "ns_dtype" in out:
        out["ns_dtype"] = getattr(torch, stored_setting("ns_dtype", out["ns_dtype"]))
    return out


def _defaults(reference: Any) -> dict[str, Any]:
    from harness.algorithms import reference_of

    return {k: stored_setting(k, v) for k, v in reference_of(Case((), reference=reference)).defaults.items()}


def brief_settings(settings: Iterable[tuple[str, Any]], reference: Any) -> list[str]:
    """``key=value`` for each setting that differs from the default of ``reference`` (a
    reference class, as ``Case.reference``)."""
    defaults = _defaults(reference)
    return [
        f"{k}={stored_setting(k, v)!r}".replace("'", "") for k, v in settings if defaults.get(k) != stored_setting(k, v)
    ]


class ParamSpec(NamedTuple):
    """One parameter of a case: its name, global shape, dtype, group and gradient pattern."""

    name: str
    shape: tuple[int, ...]
    dtype: DType = "float32"
    use_muon: bool = True
    grad: GradKind = "normal"
    grad_scale: float = 1.0
    style: Style = "colwise"

    def describe(self) -> str:
        extras = [
            "" if self.use_muon else "adamw",
            "" if self.style == "colwise" else self.style,
            "" if self.grad == "normal" else f"grad={self.grad}",
            "" if self.grad_scale == 1.0 else f"grad_scale={self.grad_scale:g}",
        ]
        return " ".join([f"{self.name}{list(self.shape)} {self.dtype}", *(e for e in extras if e)])


class Clip(NamedTuple):
    """Gradient-norm clipping before every step (``harness.tasks.clipping``): the candidate's
    declared ``clip`` (``Candidate.clip``), else ``torch.nn.utils.clip_grad_norm_``, called as
    ``clip(model, max_norm, norm_type)`` on the laid-out model. ``tied``: a parameter the model
    also holds under a second name, as a tied embedding and output head are one tensor."""

    max_norm: float
    norm_type: float = 2.0
    tied: str | None = None

    def describe(self) -> str:
        norm = "inf" if self.norm_type == float("inf") else f"{self.norm_type:g}"
        tied = f", {self.tied} tied" if self.tied else ""
        return f"clip to {self.max_norm:g} ({norm}-norm{tied})"


class QKClip(NamedTuple):
    """QK-clip after every step (MuonClip, ``harness.tasks.qk_clip``): the query and key
    projections ``q`` and ``k``, ``heads`` heads each, rescaled per head where the batch's
    largest logit exceeds ``tau``, the query by ``η^alpha``, the key by ``η^(1−alpha)``."""

    q: str
    k: str
    heads: int
    tau: float = 1.0
    alpha: float = 0.5

    def describe(self) -> str:
        alpha = "" if self.alpha == 0.5 else f", alpha {self.alpha:g}"
        return f"QK-clip {self.q}/{self.k} ({self.heads} heads, tau {self.tau:g}{alpha})"


@dataclass(frozen=True)
class Case:
    """One optimizer example: parameters, settings, steps, world and layout, and a seed."""

    params: tuple[ParamSpec, ...]
    seed: int = 0
    world_size: int = 1
    mesh: tuple[int, ...] = (1,)
    steps: int = 1
    mode: Mode | None = "all_ranks"
    settings: tuple[tuple[str, Any], ...] = ()
    candidate: Any = None
    checkpoint_after: int | None = None
    kernel: str | None = None
    #: also run the candidate on one device and compare with that (``--against self``)
    self_reference: bool = False
    #: the layout family (``harness.layouts``) on ``mesh``, which has its dims: FSDP2 alone
    #: (``fsdp``, or ``3-D`` where the case holds an expert stack: set from the parameters),
    #: HSDP on ``(replicate, shard)``, tensor parallelism alone on a 1-D ``tp`` mesh, or
    #: ``(dp, tp)`` (TP on ``tp``, each matrix by its ``style``, then ``fully_shard`` on ``dp``),
    #: ``(rep, dp, tp)`` (then HSDP's ``fully_shard`` on ``(rep, dp)``), or expert parallelism
    #: on ``(ep, efsdp)`` (each 3-D stack's experts split over ``ep`` and its rows over
    #: ``efsdp``; 2-D matrices HSDP on it). ``own``: the candidate's own ``shard``, which only the
    #: runner's adaptation sets, from the declaration; a case never reads the candidate
    layout: Layout = layouts.FSDP
    label: str = field(default="", compare=False)
    #: what ``Impl.adapt`` changed to fit the candidate's declarations, one note each
    narrowed: tuple[str, ...] = field(default=(), compare=False)
    #: the tier the update task judges in (``None``: ``harness.verdicts.compare.GRAM_PARTIAL``)
    tier: Any = field(default=None, compare=False)
    #: the reference class it is judged against (``reference.Muon``, ``reference.AdamW``…, or
    #: ``harness.algorithms.NONE``), always named: no value stands for a family
    reference: Any = field(kw_only=True)
    #: gradient-norm clipping before every step (``None``: none)
    clip: Clip | None = None
    #: QK-clip after every step (``None``: none)
    qk_clip: QKClip | None = None

    def __post_init__(self) -> None:
        if self.layout in (layouts.FSDP, layouts.EXPERTS):  # one family, titled by whether it holds experts
            object.__setattr__(self, "layout", layouts.fully_sharded(1, (p.shape for p in self.params)))
        try:
            self.layout.degrees_on(self.mesh)
        except ValueError as e:
            raise ValueError(f"Case {e}") from None

    def settings_dict(self) -> dict[str, Any]:
        """Optimizer keyword arguments (``ns_dtype`` as a ``torch.dtype``)."""
        return optimizer_settings(self.settings)

    @property
    def tp(self) -> int:
        """Tensor-parallel ranks: the size of its layout's ``tp`` dim, 1 where it has none."""
        return self.layout.degrees_on(self.mesh)[0]

    @property
    def ep(self) -> int:
        """Expert-parallel ranks: the size of its layout's ``ep`` dim, 1 where it has none."""
        return self.layout.degrees_on(self.mesh)[1]

    def with_world(self, world_size: int) -> Case:
        """The case on ``world_size`` ranks of a 1-D mesh, in its layout where that is 1-D, else FSDP2's."""
        layout = self.layout if len(self.layout.dims) == 1 else layouts.FSDP
        return replace(self, world_size=world_size, mesh=(world_size,), layout=layout)

    def describe(self) -> str:
        """What differs from the defaults, most telling first; see the module docstring."""
        parts = [", ".join(p.describe() for p in self.params), f"world {self.world_size}"]
        if self.mesh != (self.world_size,):
            parts.append(f"mesh {list(self.mesh)}")
        if self.tp > 1:
            parts.append(f"tp {self.tp}")
        if self.ep > 1:
            parts.append(f"ep {self.ep}")
        if self.layout == layouts.OWN:
            parts.append("laid out by the candidate's own shard")
        parts.append(f"{self.steps} step{'s' if self.steps != 1 else ''}")
        if self.mode not in (None, "all_ranks"):
            parts.append(str(self.mode))
        parts += brief_settings(self.settings, self.reference)
        from harness.algorithms import DEFAULT_REFERENCE, reference_of

        family = reference_of(self)
        if family.spec != DEFAULT_REFERENCE:  # the session default's family is not repeated
            parts.append(f"reference {family.name}")
        if self.clip is not None:
            parts.append(self.clip.describe())
        if self.qk_clip is not None:
            parts.append(self.qk_clip.describe())
        if self.checkpoint_after is not None:
            parts.append(f"checkpoint after step {self.checkpoint_after}")
        if self.candidate is not None:
            parts.append(f"candidate {candidate_name(self.candidate, self.reference)}")
        if self.kernel:
            parts.append(f"kernel {self.kernel}")
        if self.self_reference:
            parts.append("against itself on one device")
        if self.seed:
            parts.append(f"seed {self.seed}")
        return " · ".join(parts)


@dataclass(frozen=True)
class ReshardCase:
    """A checkpoint taken on one layout and loaded on another: ``before`` runs the first
    ``at`` steps and saves (DCP); ``after`` (the same parameters, seed, settings and steps,
    another world size, mesh or parallelism) loads and runs the rest. The reference runs
    every step on one device; both phases are compared with it."""

    before: Case
    after: Case
    at: int

    @property
    def world_size(self) -> int:
        return max(self.before.world_size, self.after.world_size)

    @property
    def narrowed(self) -> tuple[str, ...]:
        return self.before.narrowed + self.after.narrowed

    @property
    def candidate(self) -> Any:
        return self.after.candidate

    @property
    def reference(self) -> Any:
        """The reference both phases are judged against (``harness.algorithms.reference_of``)."""
        return self.after.reference

    def describe(self) -> str:
        def where(c: Case) -> str:
            mesh = "×".join(map(str, c.mesh))
            return f"{c.layout} [{mesh}]" + (f" tp {c.tp}" if c.tp > 1 else "")

        shared = self.after.describe().split(" · ")
        kept = [p for p in shared if not p.startswith(("world ", "mesh ", "tp "))]
        return " · ".join([kept[0], f"{where(self.before)} → {where(self.after)} after step {self.at}", *kept[1:]])


class KernelSpec(Protocol):
    """What a kernel case holds of its kernel (``harness.candidates.Kernel``), named by what it
    reads so that cases import nothing of the candidates."""

    @property
    def spec(self) -> str: ...

    @property
    def conventions(self) -> tuple[tuple[str, Any], ...]: ...


@dataclass(frozen=True)
class KernelCase:
    """One input for a Newton–Schulz kernel: its kind, shape, dtype and seed."""

    kernel: KernelSpec
    shape: tuple[int, ...]
    dtype: str = "bfloat16"
    input: KernelInput = "gaussian"
    steps: int = 5
    seed: int = 0

    @property
    def world_size(self) -> int:
        """A kernel runs on one rank: it sees whole matrices."""
        return 1

    @property
    def reference(self) -> Any:
        """A Newton–Schulz kernel is judged against Muon's ``reference.orthogonalize``."""
        from harness.algorithms import MUON

        return MUON.factory

    def describe(self) -> str:
        parts = [f"{self.input} {list(self.shape)} {self.dtype}", f"kernel {self.kernel.spec}"]
        if self.steps != 5:
            parts.append(f"{self.steps} steps")
        if self.seed:
            parts.append(f"seed {self.seed}")
        return " · ".join(parts)
