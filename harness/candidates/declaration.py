"""One typed declaration of everything a candidate optimizer says about itself.

A candidate (``--impl MODULE:FACTORY``, or a factory a gate runs itself) is a callable
``FACTORY(param_groups, **settings) -> torch.optim.Optimizer``. What it supports, and how it
differs from its reference, it declares in one ``Candidate``, used as a decorator::

    from harness.candidates import Candidate

    @Candidate(reference=reference.AdamW, conventions={"state_dtype": "param"}, layouts={"hsdp"})
    def my_adamw(param_groups, **settings): ...

or called on a factory defined elsewhere: ``Candidate(...)(their_factory)``. The fields, each
checked when the declaration is made (a bad one is a ``ValueError`` naming the field and the fix):

``reference``
    the reference class it implements (``reference.AdamW``), or ``"MODULE:CLASS"``; default
    ``reference.Muon``. The gates draw that reference's settings and tensors
    (``harness.algorithms``).
``conventions``
    the reference settings it implements (``{"momentum_form": "ema", "eps_form": "clamp"}``),
    its forms too (``{"kernels": "foreach"}``: ``harness.algorithms``, ``FORMS``).
    Every case uses them on both sides. A key the reference does not know, or a value it cannot
    take, makes every gate skip, naming it; nothing is compared silently. A key a letter or two
    from one a reference knows (``momentun_form``) is a typo: refused when ``--impl`` loads it,
    naming the key it is near (``harness.algorithms.TYPO``).
``features``
    which of ``adamw`` (Muon's AdamW groups), ``experts`` (3-D parameters), ``bf16``,
    ``checkpoint``, ``fully_shard`` (with ``shard`` only) and ``heads`` (Newton–Schulz on row
    blocks, the reference's ``ns_heads`` and ``ns_split``) it supports; default all but ``heads``, which a candidate
    names to be judged on it. Cases are narrowed to them and every narrowing is reported. A parameter without a gradient is not a
    feature: every candidate meets one, unless it declares ``needs_every_grad``.
``needs_every_grad``
    ``True`` where its package refuses, by its stated contract, a step while any parameter's
    gradient is missing (torchtitan's ``DistMuon``); default ``False``. Cases then give every
    parameter a gradient on every step and every rank, each such narrowing reported; the gates
    whose claim is a missing gradient skip, naming it; ``--probe-undeclared`` tries them anyway.
``layouts``
    the layouts beyond FSDP2's 1-D ``(Shard(0),)`` it takes, by their names in
    ``harness.layouts`` (``hsdp``, ``tp``, ``fsdp_tp``, ``hsdp_tp``, ``ep_efsdp``); default none. Cases of others are narrowed to FSDP2
    alone.
``tiers``
    calibrated tiers its arithmetic differs within by design (``gram_partial``); it adds the
    tier's gate and excuses no bitwise gate.
``differences``
    known causes of other arithmetic, of those its reference family declares
    (``harness.algorithms.Algorithm.causes``: Muon's ``reference.MUON_CAUSES``, and
    ``signed_zero`` for any family), checked when ``--impl`` loads it and against the session's
    reference. A case of a bitwise gate that differs is then judged by the tier calibrated on exactly
    those causes at its own settings: green (``within causes``) inside it, red past it, and
    ``not judged`` where no tier can tell (``harness.verdicts.causes.judge_causes``); the cause gate holds
    its update and state to that tier over several steps.
``devices``
    the device types its ranks may run on, of ``cpu`` and ``cuda``; default both.
``max_world``
    the largest world size it supports; default any.
``min_ns_steps``
    the fewest Newton–Schulz iterations it takes (a case's ``ns_steps`` below is raised to it).
``default_group``
    ``True`` when it talks over the default process group (DDP-style): every case runs on all
    the ranks there are.
``shard``, ``piece``
    bring-your-own sharding: ``shard(module, mesh)`` lays the module's parameters out in place,
    instead of ``fully_shard``; a parameter left a plain tensor holding this rank's piece is named
    by ``piece(name, param)``, a tuple of slices of the full tensor.
``single_device``
    a factory of the same contract for plain tensors on one device, which ``--against self``
    compares it with; without it, the candidate itself runs on a one-rank FSDP2 mesh.
``package``
    the package it adapts, for the matrix (``"muon-optimizer"``); default the factory's spec.
``clip``
    its own gradient-norm clipping, ``clip(model, max_norm, norm_type) -> total_norm``: it scales
    the gradients of ``model`` (laid out as the case is) in place and returns the norm it found,
    as ``torch.nn.utils.clip_grad_norm_`` does on ``model.parameters()``. The clipping gate judges
    it (``gates/test_clip_gates.py``); without it, that gate skips, naming why.
``qk_clip``
    its QK-clip (MuonClip), ``qk_clip(model, pairs, tau, alpha)``: for each ``(query name, key
    name, maxima)`` of ``pairs``, ``maxima`` the largest attention logit of each head on this
    rank's batch, it rescales the heads of both projections whose largest logit over the whole
    batch exceeds ``tau``, in place. The QK-clip gate judges it (``gates/test_qk_clip_gates.py``);
    without it, that gate skips, naming why.
``thresholds``
    the tensor sizes (numbers of elements) at which it changes behaviour: a state quantized only
    from 4096 elements, blocks of 256. The generators then draw tensors on both sides of each,
    whole and as every world size's shards (``harness.cases.strategies.threshold_shapes``).

Its ``state[p]`` may hold any of the reference's state (``momentum_buffer``, ``exp_avg`` …)
with the parameter's layout; each is compared when present.

Code that cannot import muongate (``distributed_impl``) may set the attribute ``muongate`` to a
dict of these fields instead. Declarations made before this object existed, as ``muongate_*``
attributes of the factory
(``muongate_conventions``, ``muongate_features`` …), are still read, with a
``DeprecationWarning`` naming the replacement.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from harness.layouts import DECLARABLE

F = TypeVar("F")

FEATURES = frozenset({"adamw", "experts", "bf16", "checkpoint", "fully_shard", "heads"})
#: what a candidate that declares no ``features`` supports: every feature but those a candidate
#: must name, because they arrived after the adapters were written (``heads``)
DEFAULT_FEATURES = FEATURES - {"heads"}
#: by their one spelling in code (``harness.layouts``)
LAYOUTS = DECLARABLE
TIERS = frozenset({"gram_partial"})
DEVICES = frozenset({"cpu", "cuda"})

#: the attribute a declaration is kept in on its factory
ATTRIBUTE = "muongate"


def _names(field_name: str, value: Iterable[str], known: frozenset[str], *, empty: bool = True) -> frozenset[str]:
    chosen = frozenset(value)
    if isinstance(value, str):
        raise ValueError(f"Candidate {field_name}={value!r}: a set of names, e.g. {field_name}={{{value!r}}}")
    unknown = chosen - known
    if unknown or (not empty and not chosen):
        raise ValueError(f"Candidate {field_name}: unknown {sorted(unknown)}; choose from {sorted(known)}")
    return chosen


@dataclass(frozen=True)
class Candidate:
    """What a candidate optimizer declares about itself (see the module docstring)."""

    reference: Any = None
    conventions: Mapping[str, Any] = field(default_factory=dict)
    features: Iterable[str] = DEFAULT_FEATURES
    layouts: Iterable[str] = frozenset()
    tiers: Iterable[str] = frozenset()
    differences: Iterable[str] = frozenset()
    devices: Iterable[str] = DEVICES
    max_world: int | None = None
    min_ns_steps: int = 0
    needs_every_grad: bool = False
    default_group: bool = False
    shard: Callable[..., Any] | None = None
    piece: Callable[..., Any] | None = None
    single_device: Callable[..., Any] | None = None
    package: str | None = None
    thresholds: Iterable[int] = ()
    clip: Callable[..., Any] | None = None
    qk_clip: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        put = object.__setattr__
        put(self, "conventions", dict(self.conventions))
        put(self, "features", _names("features", self.features, FEATURES))
        put(self, "layouts", _names("layouts", self.layouts, LAYOUTS))
        put(self, "tiers", _names("tiers", self.tiers, TIERS))
        # checked against its family's causes when a session loads it (Impl.load) and resolves its
        # reference: a declaration without a reference is judged against the session's
        put(self, "differences", frozenset(self.differences))
        put(self, "devices", _names("devices", self.devices, DEVICES, empty=False))
        if self.max_world is not None and not (isinstance(self.max_world, int) and self.max_world >= 1):
            raise ValueError(f"Candidate max_world={self.max_world!r}: a whole number of ranks ≥ 1, or None for any")
        if not (isinstance(self.min_ns_steps, int) and self.min_ns_steps >= 0):
            raise ValueError(f"Candidate min_ns_steps={self.min_ns_steps!r}: a whole number ≥ 0")
        if not isinstance(self.needs_every_grad, bool):
            raise ValueError(f"Candidate needs_every_grad={self.needs_every_grad!r}: True or False")
        for name in ("shard", "piece", "single_device", "clip", "qk_clip"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise ValueError(f"Candidate {name}={value!r}: a function, e.g. {name}=my_{name}")
        put(self, "thresholds", tuple(self.thresholds))
        if any(not (isinstance(t, int) and t >= 1) for t in self.thresholds):
            raise ValueError(
                f"Candidate thresholds={self.thresholds!r}: numbers of elements ≥ 1, e.g. thresholds=(4096,)"
            )
        if self.piece is not None and self.shard is None:
            raise ValueError("Candidate piece=…: names the pieces of a shard=… function's layout; declare shard too")

    def __call__(self, factory: F) -> F:
        """Declares this on ``factory`` and returns it: ``@Candidate(...)`` or ``Candidate(...)(factory)``.
        A factory is declared once: a second, different declaration would replace every field of
        the first, the ones it does not name with their defaults, so it is refused."""
        earlier = vars(factory).get(ATTRIBUTE) if hasattr(factory, "__dict__") else None
        if isinstance(earlier, Candidate) and earlier != self:
            name = getattr(factory, "__qualname__", repr(factory))
            raise ValueError(
                f"Candidate on {name}: it is declared already, and a second declaration would reset the fields it "
                f"does not name; put every field in one Candidate(...), or use "
                f"dataclasses.replace(declaration_of({name}), ...)"
            )
        setattr(factory, ATTRIBUTE, self)
        return factory


_LEGACY = {f.name: f"muongate_{f.name}" for f in fields(Candidate)}
#: the declarations read from ``muongate_*`` attributes, by factory (each read and warned about once)
_READ: dict[int, tuple[Any, Candidate]] = {}


def declaration_of(factory: Any) -> Candidate:
    """What ``factory`` declares: its ``Candidate``, or one read from the ``muongate_*`` attributes
    it was declared with before (a ``DeprecationWarning`` once per factory), or the defaults."""
    declared = getattr(factory, ATTRIBUTE, None)
    if isinstance(declared, Candidate):
        return declared
    read = _READ.get(id(factory))
    if read is not None and read[0] is factory:
        return read[1]
    if isinstance(declared, Mapping):  # the fields as a dict, for code that cannot import harness
        _READ[id(factory)] = (factory, Candidate(**declared))
        return _READ[id(factory)][1]
    found = {name: getattr(factory, legacy) for name, legacy in _LEGACY.items() if hasattr(factory, legacy)}
    if found:
        given = ", ".join(f"{name}=…" for name in found)
        warnings.warn(
            f"{getattr(factory, '__qualname__', factory)!r} declares itself with muongate_* attributes "
            f"({', '.join(_LEGACY[n] for n in found)}); declare one harness.candidates.Candidate({given}) "
            "instead (its docstring is the contract)",
            DeprecationWarning,
            stacklevel=2,
        )
    _READ[id(factory)] = (factory, Candidate(**found))
    return _READ[id(factory)][1]
