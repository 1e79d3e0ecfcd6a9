"""The reference slot: which single-device optimizer a session's candidates are judged against.

A reference is a ``torch.optim.Optimizer`` class on one device (``reference.Muon``, the
default, or ``reference.AdamW``; ``--reference MODULE:CLASS`` names another) that declares,
as class attributes, what the gates need to know about its algorithm:

``DEFAULTS``
    every setting it takes and its default; a candidate is called with all of them.
``SPACE`` and ``CONVENTIONS``
    the values the gates draw for each hyperparameter and each convention, the default
    first (it is what a failing case shrinks towards). A value may be a
    ``reference.Interval(lo, hi)``, any float in it. ``CONVENTIONS`` are what a candidate
    fixes by declaring them (``Candidate.conventions``).
``FORMS`` (optional, default none)
    settings it takes beside ``DEFAULTS`` that express another implementation's arithmetic
    (``reference.AdamW``'s ``kernels``, ``reference.Muon``'s ``ns_form``…), each with its
    default: the gates do not draw them and a candidate is not handed them, unless it declares
    one among its conventions (``gates/examples/torch_adam.py``'s ``adamw_foreach``); an
    engine names them in ``Engine.conventions``.
``PARAM_NDIMS``
    the parameters it takes, by number of dimensions (the gates draw those FSDP2 can shard:
    1-D to 3-D). A reference whose ``DEFAULTS`` has ``use_muon`` is *hybrid*: its
    ``use_muon=True`` groups take ``PARAM_NDIMS`` and its other groups run AdamW on anything.
``STATE``
    the state it keeps per parameter, compared by name with a candidate's.
``ELEMENTWISE`` (optional, default ``False``)
    ``True`` where every element's step reads that element alone (AdamW): a piece of a
    parameter steps on its own, and scenarios whose meaning needs the whole tensor skip.
``CLAIMS`` (optional, default none)
    the gates' claims that hold for this family alone, by name: ``newton_schulz`` (its update
    is Newton–Schulz's: the gates draw the gathered and owner-split modes and judge declared
    causes of difference), ``hybrid_groups``, ``bf16_norm_ties``, ``oracle_spectrum``,
    ``tier:causes``. A subclass inherits its parent's; a new family declares its own.
``ENGINE_NAME`` (optional, default none)
    the optimizer's name in the engine contract (``harness.engines``): an engine case that
    asks for ``muon`` is judged against the registered family that declares that name.
``ROUTES`` (optional, default none)
    the state that shows which algorithm stepped a parameter, by the algorithm's name:
    ``{"Muon": ("momentum_buffer",), "AdamW": ("exp_avg", "exp_avg_sq")}``. A hybrid
    reference's first route is its ``use_muon`` groups', and ``AdamW`` its other groups'. The
    routing audit (``gates/test_routing_gates.py``) reads a candidate's state by them; a
    reference that declares none is not audited, and the gate says so.
``CAUSES`` (optional, default none)
    the causes of difference from its arithmetic that muongate emulates and calibrates a tier
    for (``harness.verdicts.causes``), by name, each with what it is. A candidate declares the ones its
    arithmetic has (``Candidate.differences``); any other name is refused when it loads. Every
    family also has ``ANY_FAMILY``'s, which change no value. A subclass inherits its parent's.

The families muongate brings are registered once, in ``FAMILIES``.

The gates whose claim holds for any algorithm (one step, several steps, checkpoints,
resharding, world sizes, robustness, layouts, ``--against self``) draw from these; a gate
whose claim the reference does not declare skips, naming why (``GateRunner.algorithm_claim``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

#: the reference of a session that names none
DEFAULT_REFERENCE = "reference:Muon"
#: ``--reference none``
NONE = "none"
#: how alike (``difflib``'s ratio) an unknown setting's name must be to one a reference takes to
#: be taken for a typo of it: ``momentun_form`` is 0.92 from ``momentum_form``, ``ns_step`` 0.93
#: from ``ns_steps``; the names adapters declare on purpose, for what no reference expresses, lie
#: further (optimuon's ``normuon`` 0.78 from ``normuon_eps``, ``cautious_weight_decay`` 0.73 from
#: ``weight_decay``; heavyball's ``nesterov_form`` 0.76 from ``nesterov``)
TYPO = 0.85
#: the causes of difference of any family: they change no value, only a zero's sign, so their
#: tier is equality in value (``harness.verdicts.causes.SIGN_ONLY``)
ANY_FAMILY: dict[str, str] = {
    "signed_zero": (
        "a zero's sign set by where the element falls in torch's CPU kernel blocks (lerp_ at weight 1 on a -0.0 "
        "gradient: examples/findings/torch_cpu_lerp_signed_zero.py), so a shard and one device hold zeros of other "
        "signs; judged equal in value, any algorithm"
    ),
}
_DECLARED = ("DEFAULTS", "SPACE", "CONVENTIONS", "PARAM_NDIMS", "STATE")


@dataclass(frozen=True)
class Algorithm:
    """A reference optimizer class and what it declares (see the module docstring)."""

    spec: str
    factory: Any = field(compare=False, repr=False)
    defaults: Mapping[str, Any] = field(compare=False, repr=False)
    space: Mapping[str, tuple[Any, ...]] = field(compare=False, repr=False)
    conventions: Mapping[str, tuple[Any, ...]] = field(compare=False, repr=False)
    ndims: tuple[int, ...] = ()
    #: the state compared by name; ``None``: every state tensor both sides hold (``--reference none``)
    state: tuple[str, ...] | None = ()
    #: every element's step reads that element alone (``ELEMENTWISE``)
    elementwise: bool = False
    #: the gates' claims of this family alone (``CLAIMS``)
    claims: frozenset[str] = frozenset()
    #: its name in the engine contract (``ENGINE_NAME``)
    engine_name: str | None = None
    #: the state that shows which algorithm stepped a parameter (``ROUTES``)
    routes: Mapping[str, tuple[str, ...]] = field(default_factory=dict, compare=False, repr=False)
    #: the settings that express another implementation's arithmetic, with their defaults (``FORMS``)
    forms: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    #: the causes of difference a candidate of it may declare, with what each is (``CAUSES``
    #: and ``ANY_FAMILY``'s)
    causes: Mapping[str, str] = field(default_factory=lambda: dict(ANY_FAMILY), compare=False, repr=False)

    @property
    def name(self) -> str:
        """The class's name: ``Muon``, ``AdamW``; ``none`` for no reference."""
        return NONE if self.factory is None else str(self.factory.__name__)

    @property
    def title(self) -> str:
        """The dotted name a reader knows it by: ``reference.Muon``."""
        return "no reference (--reference none)" if self.factory is None else self.spec.replace(":", ".")

    @property
    def hybrid(self) -> bool:
        """Muon-style: ``use_muon`` groups of the algorithm beside AdamW groups for the rest."""
        return "use_muon" in self.defaults

    @property
    def orthogonalizes(self) -> bool:
        """Whether its update is Newton–Schulz's (it declares the ``newton_schulz`` claim)."""
        return "newton_schulz" in self.claims

    @property
    def in_case(self) -> Any:
        """What a ``Case`` carries as its ``reference``: the class, or ``"none"`` for no reference."""
        return NONE if self.factory is None else self.factory

    @classmethod
    def of(cls, factory: Any, spec: str = "") -> Algorithm:
        """Reads a reference class's declarations; a missing or malformed one is a ``ValueError``
        naming it and the fix."""
        module = "reference" if factory.__module__.startswith("reference.") else factory.__module__
        spec = spec or f"{module}:{factory.__qualname__}"
        missing = [name for name in _DECLARED if not hasattr(factory, name)]
        if missing:
            raise ValueError(
                f"--reference {spec}: declares no {', '.join(missing)}; a reference class declares "
                f"{', '.join(_DECLARED)} (see harness/algorithms.py)"
            )
        defaults = dict(factory.DEFAULTS)
        drawn = {**factory.SPACE, **factory.CONVENTIONS}
        for name, values in drawn.items():
            if name not in defaults:
                raise ValueError(f"--reference {spec}: SPACE or CONVENTIONS names {name!r}, which DEFAULTS lacks")
            if not values:
                raise ValueError(f"--reference {spec}: {name!r} has no values to draw")
        ndims = tuple(factory.PARAM_NDIMS)
        if not ndims or any(n not in (0, 1, 2, 3) for n in ndims):
            raise ValueError(f"--reference {spec}: PARAM_NDIMS {ndims} must be some of 0, 1, 2, 3")
        return cls(
            spec, factory, defaults, dict(factory.SPACE), dict(factory.CONVENTIONS), ndims, tuple(factory.STATE),
            bool(getattr(factory, "ELEMENTWISE", False)), frozenset(getattr(factory, "CLAIMS", ())),
            getattr(factory, "ENGINE_NAME", None),
            {name: tuple(keys) for name, keys in getattr(factory, "ROUTES", {}).items()},
            dict(getattr(factory, "FORMS", {})),
            {**ANY_FAMILY, **getattr(factory, "CAUSES", {})},
        )  # fmt: skip

    @classmethod
    def load(cls, spec: str) -> Algorithm:
        """``MODULE:CLASS`` (``--reference``), imported and read; ``none`` is ``NO_REFERENCE``. A
        spec that names no class (``AdamW``, ``reference:Adam``) is a ``ValueError`` that lists
        the references muongate ships, which is what such a spec was most likely after."""
        from harness.candidates.loading import load_object

        if spec == NONE:
            return NO_REFERENCE
        try:
            factory = load_object(spec)
        except (AttributeError, ValueError) as e:
            raise ValueError(f"--reference {spec}: {e}; {shipped_references()}") from e
        return cls.of(factory, spec)

    def route_of(self, use_muon: bool) -> str | None:
        """The route (``ROUTES``) a parameter of a ``use_muon`` group, or of another, is declared
        for: a hybrid reference's first for ``use_muon``, else ``AdamW``; any other's first."""
        names = list(self.routes)
        if not names:
            return None
        return names[0] if use_muon or not self.hybrid else "AdamW" if "AdamW" in self.routes else None

    def unknown_causes(self, differences: Iterable[str]) -> str | None:
        """Why a candidate of this family cannot declare ``differences`` (names it has no tier
        for), or ``None``."""
        unknown = sorted(set(differences) - self.causes.keys())
        if not unknown:
            return None
        return f"differences {unknown} are not causes of {self.title}; its causes are {sorted(self.causes)}"

    def typos(self, names: Iterable[str], elsewhere: Iterable[str] = ()) -> dict[str, str]:
        """The names of ``names`` that are no setting of this reference (``DEFAULTS``' or
        ``FORMS``') nor of ``elsewhere``, but lie within ``TYPO`` of one: each with that one.
        ``--reference none`` takes any name."""
        if self.factory is None:
            return {}
        known = sorted({*self.defaults, *self.forms, *elsewhere})
        return {
            name: close[0]
            for name in sorted(set(names) - set(known))
            if (close := difflib.get_close_matches(name, known, n=1, cutoff=TYPO))
        }

    def check(self, settings: Mapping[str, Any]) -> list[str]:
        """Why the reference cannot take these settings (unknown keys, each a typo's with the name
        it is near; refused values), or nothing."""
        import torch

        if self.factory is None:
            return []
        unknown = sorted(k for k in settings if k not in self.defaults and k not in self.forms)
        if unknown:
            typos = self.typos(unknown)
            return [f"unknown keys {unknown}" + "".join(f"; did you mean {v!r} for {k!r}?" for k, v in typos.items())]
        probe = torch.zeros(2, 2, requires_grad=True)
        try:
            self.factory([{"params": [probe], "param_names": ["probe"]}], **settings)
        except (ValueError, AttributeError, TypeError) as e:
            return [str(e)]
        return []


def reference_of(case: Any) -> Algorithm:
    """The algorithm a case or a training spec is judged against (its ``reference``: a class, or ``NONE``)."""
    if case.reference is None:
        raise ValueError(f"{type(case).__name__} names no reference: set its reference to a family's class")
    return family_of(case.reference)


def family_of(factory: Any) -> Algorithm:
    """The algorithm of a reference class (``NONE``: no reference)."""
    if factory == NONE:
        return NO_REFERENCE
    return MUON if factory is MUON.factory else _declared(factory)


def judged_family(named: Algorithm | None, spec: str | None, impl: Any, against: str) -> Algorithm:
    """The family a session judges against: ``named`` (loaded from ``--reference spec``), else the
    one the candidate ``impl`` declares, else Muon. Where they cannot go together, a
    ``ValueError`` with the one line that says why and what to do."""
    declared = impl.algorithm if impl is not None and impl.declares_reference else None
    if named is None:
        return declared or MUON
    if named is NO_REFERENCE:
        if impl is None or against != "self":
            raise ValueError(
                "--reference none judges a candidate against itself on one device only: "
                "add --impl MODULE:FACTORY --against self"
            )
        return named
    if declared is not None and declared.spec != named.spec:
        raise ValueError(
            f"--reference {spec} with --impl {impl.spec}, which declares reference {declared.spec}: drop --reference"
        )
    if impl is not None and (refused := named.unknown_causes(impl.differences)):
        raise ValueError(f"--reference {spec} with --impl {impl.spec}: its Candidate {refused}")
    if impl is None and named.factory is not MUON.factory and FAMILIES.get(named.spec) is None:
        raise ValueError(
            f"--reference {spec}: muongate ships no candidate of {named.name}; name one with --impl MODULE:FACTORY"
        )
    return named


def built_in(algorithm: Algorithm) -> str:
    """``MODULE:FACTORY`` of the candidate muongate ships for ``algorithm`` (``FAMILIES``): what a
    case that names no candidate runs; a family without one is a ``ValueError`` naming it."""
    shipped = FAMILIES.get(algorithm.spec)
    if shipped is None:
        raise ValueError(f"muongate ships no candidate of {algorithm.title}: name one (--impl MODULE:FACTORY)")
    return shipped


def built_in_factory(algorithm: Algorithm) -> Any:
    """The factory ``built_in(algorithm)`` names, imported."""
    from harness.candidates.loading import load_object

    return load_object(built_in(algorithm))


@cache
def _declared(factory: Any) -> Algorithm:
    return Algorithm.of(factory)


def _muon() -> Algorithm:
    import reference

    return Algorithm.of(reference.Muon, DEFAULT_REFERENCE)


MUON = _muon()
#: the algorithm families muongate brings, each a reference class that declares what it is, with
#: a sharded candidate of it that muongate ships and that passes its gates (``None``: none does)
FAMILIES: dict[str, str | None] = {
    DEFAULT_REFERENCE: "distributed_impl:ShardedMuon",
    "reference:NorMuon": "distributed_impl:ShardedNorMuon",
    "reference:AdamW": "gates.examples.torch_adam:adamw_for_loop",
    "reference:LowBitAdamW": None,
    "reference:Adafactor": None,
}


def shipped_references() -> str:
    """The references muongate ships (``FAMILIES``) and ``none``, in a sentence for an error."""
    return f"muongate's references are {', '.join(FAMILIES)}, and {NONE} (with --against self)"


@cache
def families() -> tuple[Algorithm, ...]:
    """The registered families (``FAMILIES``), each read once."""
    return tuple(map(Algorithm.load, FAMILIES))


def engine_family(name: str) -> Algorithm:
    """The registered family whose engine-contract name is ``name`` (``muon``, ``adamw``)."""
    found = [a for a in families() if a.engine_name == name]
    if len(found) != 1:
        raise ValueError(f"the engine optimizer {name!r} names {len(found)} of muongate's families {list(FAMILIES)}")
    return found[0]


def engine_names() -> frozenset[str]:
    """The names the engine contract knows: those the registered families declare."""
    return frozenset(a.engine_name for a in families() if a.engine_name)


#: ``--reference none``: no reference at all, for any ``torch.optim.Optimizer`` judged against its
#: own single-device self only (``--against self``): no settings drawn (the optimizer's own
#: defaults), parameters of 1 to 3 dimensions, every state tensor compared
NO_REFERENCE = Algorithm(NONE, None, {}, {}, {}, (1, 2, 3), None)
