"""Putting another team's sharded optimizer (``--impl MODULE:FACTORY``) through the gates.

``FACTORY(param_groups, **settings)`` returns a ``torch.optim.Optimizer``. ``param_groups`` is
a list of dicts with ``params`` (FSDP2 DTensor parameters, ``(Shard(0),)`` on a 1-D mesh, also
on a 1-rank mesh at world size 1; and the layouts it declares, as those layouts' DTensors) and
``param_names`` (and, for ``reference.Muon``, ``use_muon``: Muon for hidden matrices, AdamW
otherwise). ``settings`` are all of its reference's keywords (``harness.algorithms``), defaults
included. Everything a candidate declares about itself is one ``Candidate``
(``harness/candidates/declaration.py``, whose docstring is the contract); ``Impl`` is that
declaration read for a session, and narrows each case to it (``adapt``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from harness import layouts
from harness.algorithms import MUON, Algorithm, families, reference_of
from harness.candidates.declaration import DEVICES, FEATURES, LAYOUTS, TIERS, declaration_of
from harness.candidates.loading import load_callable
from harness.cases.case import Case, ParamSpec, optimizer_settings, stored_setting

#: what a candidate that declares ``needs_every_grad`` does not take, named as the features are
#: (``missing``, ``probed``): a parameter without a gradient on some step or some rank
MISSING_GRADS = "missing_grads"
_MISSING_KINDS = ("none", "every_other", "late", "rank_asymmetric")


#: a convention's value that a case resolves: the number of ranks of its 1-D mesh. ``ns_stacks``
#: so declared is a stack batched in each rank's own chunk of its experts (FSDP2's ``Shard(0)``),
#: as a candidate that orthogonalizes the experts it holds in one batched product does
#: (torchtitan's ``DistMuon``): the reference's ``ns_stacks=world``
PER_RANK = "per_rank"


def per_case(conventions: Any, world: int) -> dict[str, Any]:
    """Declared ``conventions`` (pairs) with each ``PER_RANK`` value resolved for ``world`` ranks."""
    return {k: world if v == PER_RANK else v for k, v in conventions}


class UnsupportedConvention(Exception):
    """The candidate declares a convention the reference cannot express."""


def _reference(spec: str, declared: Any) -> Algorithm:
    """The reference a candidate implements: its declared one (a reference class, or
    ``MODULE:CLASS``), else ``reference.Muon``."""
    if declared is None:
        return MUON
    try:
        return Algorithm.load(declared) if isinstance(declared, str) else Algorithm.of(declared)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"--impl {spec}: Candidate reference={declared!r}: {e}") from e


@dataclass(frozen=True)
class Impl:
    """A candidate optimizer (the factory itself) and what it declared about itself."""

    spec: str
    factory: Any = field(compare=False, repr=False)
    conventions: tuple[tuple[str, Any], ...] = ()
    max_world: int | None = None
    features: frozenset[str] = FEATURES
    inexpressible: tuple[str, ...] = ()
    layouts: frozenset[str] = frozenset()
    tiers: frozenset[str] = frozenset()
    own_sharding: bool = False
    devices: frozenset[str] = DEVICES
    default_group: bool = False
    differences: frozenset[str] = frozenset()
    min_ns_steps: int = 0
    #: the reference it implements (``Candidate.reference``)
    algorithm: Algorithm = MUON

    #: whether the candidate names its reference itself (``Candidate.reference``)
    declares_reference: bool = False
    #: the features and layouts it did not declare and runs anyway (``probing``)
    probed: tuple[str, ...] = ()
    #: it refuses a step with a gradient missing (``Candidate.needs_every_grad``)
    needs_every_grad: bool = False

    @classmethod
    def load(cls, spec: str) -> Impl:
        """Imports ``MODULE:FACTORY`` and reads its declaration; errors name what is wrong."""
        factory = load_callable("impl", spec)
        try:
            declared = declaration_of(factory)
        except ValueError as e:
            raise ValueError(f"--impl {spec}: {e}") from e
        conventions = {k: stored_setting(k, v) for k, v in declared.conventions.items()}
        algorithm = _reference(spec, declared.reference)
        refused = algorithm.unknown_causes(declared.differences)
        if refused:
            raise ValueError(f"--impl {spec}: Candidate {refused}")
        # A name a letter or two from a setting is a typo, refused here naming that setting: left to
        # the gates it would skip every one of them and end the session NOT JUDGED. Another unknown
        # name is what the reference cannot express, declared on purpose (an adapter's package's own
        # arithmetic), and skips them, naming it. A candidate that names no reference may be judged
        # against the session's (--reference), so the names of every family muongate ships count.
        shipped = () if declared.reference is not None else [s for a in families() for s in (*a.defaults, *a.forms)]
        typos = algorithm.typos(declared.conventions, shipped)
        if typos:
            said = ", ".join(f"{k!r} (did you mean {v!r}?)" for k, v in typos.items())
            raise ValueError(f"--impl {spec}: Candidate conventions: unknown keys {said}")
        return cls(
            spec,
            factory,
            tuple(sorted(conventions.items())),
            declared.max_world,
            frozenset(declared.features),
            tuple(algorithm.check(optimizer_settings(per_case(conventions.items(), 1).items()))),
            frozenset(declared.layouts),
            frozenset(declared.tiers),
            declared.shard is not None,
            frozenset(declared.devices),
            declared.default_group,
            frozenset(declared.differences),
            declared.min_ns_steps,
            algorithm,
            declared.reference is not None,
            needs_every_grad=declared.needs_every_grad,
        )

    def probing(self) -> Impl:
        """This candidate run on every feature and layout, those it did not declare too
        (``--probe-undeclared``): what its package does there, never narrowed away."""
        undeclared = (FEATURES - self.features - {"fully_shard"}) | (LAYOUTS - self.layouts)
        undeclared |= {MISSING_GRADS} if self.needs_every_grad else set()
        return replace(
            self, features=FEATURES, layouts=LAYOUTS, probed=tuple(sorted(undeclared)), needs_every_grad=False
        )

    def probing_only(self, claim: set[str]) -> Impl:
        """This probing candidate, for a gate whose claim is about ``claim`` (``require``): where
        the claim names undeclared features or layouts, only those are probed and the other
        undeclared ones are narrowed as without the probe, so that a probe of one (a checkpoint)
        cannot fail for another (AdamW groups). A claim about a layout probes every undeclared
        layout (the gate draws them all); a gate whose claim names none of them probes all."""
        probed = set(self.probed)
        kept = probed & claim
        if not kept:
            return self
        if kept & LAYOUTS:
            kept |= probed & LAYOUTS
        return replace(
            self,
            features=(self.features - probed) | (kept & FEATURES),
            layouts=(self.layouts - probed) | (kept & LAYOUTS),
            probed=tuple(sorted(kept)),
            needs_every_grad=MISSING_GRADS in probed - kept,
        )

    def judged_against(self, algorithm: Algorithm) -> Impl:
        """This candidate judged against ``algorithm`` (``--reference``), its conventions checked there."""
        if algorithm.spec == self.algorithm.spec:
            return self
        inexpressible = tuple(algorithm.check(optimizer_settings(per_case(self.conventions, 1).items())))
        return replace(self, algorithm=algorithm, inexpressible=inexpressible)

    def _check_expressible(self) -> None:
        if self.inexpressible:
            raise UnsupportedConvention(
                f"{self.spec} declares conventions the reference cannot express: {'; '.join(self.inexpressible)}"
            )

    def adapt(self, case: Case, pool_world: int | None = None) -> Case:
        """The case narrowed to what this candidate declared it supports, on its conventions.

        Every change to what the case exercises is written into its ``narrowed`` notes, so
        that a gate reports what it really ran (and a hand-picked case whose point was
        narrowed away is skipped). The declared conventions replace the case's own settings
        of those keys: that is the candidate's arithmetic, not a narrowing (``overridden``)."""
        self._check_expressible()
        if case.reference is not self.algorithm.in_case:
            raise UnsupportedConvention(
                f"{self.spec} implements {self.algorithm.spec}; this case is drawn for {reference_of(case).spec}"
            )
        notes: list[str] = []
        params: list[ParamSpec] = []
        dropped = [p.name for p in case.params if not p.use_muon and "adamw" not in self.features]
        if dropped:
            notes.append(f"AdamW parameters {dropped} left out (adamw not declared)")
        for p in case.params:
            if p.use_muon or "adamw" in self.features:
                params.append(self._narrow(p, notes))
        world = case.world_size if self.max_world is None else min(case.world_size, self.max_world)
        if world != case.world_size:
            notes.append(f"world {case.world_size} → {world} (max_world {self.max_world})")
        if self.default_group and pool_world is not None and world != pool_world:
            notes.append(f"world {world} → {pool_world} (default_group: it talks to every rank)")
            world = pool_world
        layout = case.layout.name
        flat = layout not in self.layouts or world != case.world_size
        if case.mesh != (case.world_size,) and flat:
            notes.append(f"mesh {list(case.mesh)} → [{world}] ({layout} not in its declared layouts)")
        if (case.tp > 1 or case.ep > 1) and flat:
            alone = "its own sharding (shard)" if self.own_sharding else "FSDP2 alone"
            notes.append(f"{case.layout} → {alone} ({layout} not in its declared layouts)")
        settings = dict(case.settings)
        if settings.get("ns_steps", self.min_ns_steps) < self.min_ns_steps:
            notes.append(f"ns_steps {settings['ns_steps']} → {self.min_ns_steps} (min_ns_steps)")
            settings["ns_steps"] = self.min_ns_steps
        mesh = (world,) if flat else case.mesh
        if PER_RANK in dict(self.conventions).values() and len(mesh) > 1:
            raise UnsupportedConvention(
                f"{self.spec}: a convention {PER_RANK!r} is for a 1-D mesh; this case's is {mesh}"
            )
        checkpoint = case.checkpoint_after if "checkpoint" in self.features else None
        if checkpoint != case.checkpoint_after:
            notes.append("checkpoint round trip left out (checkpoint not declared)")
        return replace(
            case,
            params=tuple(params),
            candidate=self.factory,
            mode=None,
            world_size=world,
            mesh=mesh,
            layout=layouts.FSDP if flat else case.layout,
            settings=tuple({**settings, **per_case(self.conventions, world)}.items()),
            checkpoint_after=checkpoint,
            narrowed=case.narrowed + tuple(notes),
        )

    def overridden(self, case: Case) -> list[str]:
        """The case's own settings that this candidate's declared conventions replace."""
        declared = dict(self.conventions)
        return [
            f"{key} {value} → {declared[key]} (declared convention)"
            for key, value in case.settings
            if key in declared and stored_setting(key, value) != declared[key]
        ]

    def missing(self, features: set[str]) -> list[str]:
        """Which of ``features``, layouts, tiers, devices, ``"world"`` (more than one rank) and
        ``MISSING_GRADS`` (where it declares ``needs_every_grad``) this candidate did not declare."""
        declared = self.features if self.own_sharding else self.features | {"fully_shard"}
        gone = sorted(features & FEATURES - declared) + sorted(features & LAYOUTS - self.layouts)
        gone += sorted(features & TIERS - self.tiers) + sorted(features & DEVICES - self.devices)
        if "world" in features and self.max_world is not None and self.max_world < 2:
            gone.append("world")
        if MISSING_GRADS in features and self.needs_every_grad:
            gone.append(MISSING_GRADS)
        return gone

    def adapt_training(self, spec: Any) -> Any:
        """A training spec (MoE scenario, transformer) run with this candidate on its conventions;
        ``UnsupportedConvention`` when it cannot take the model's world size or parameters, or
        implements another reference than Muon for a model that trains with Muon only (the MoE
        scenarios, ``--model``'s models). A transformer trains with the candidate's reference, on
        that reference's defaults and the candidate's conventions."""
        self._check_expressible()
        muon = self.algorithm.factory is MUON.factory
        # a spec whose reference is a field of its own trains with any family; the others with Muon alone
        any_family = "reference" in {f.name for f in fields(spec)}
        if not muon and not (self.algorithm.factory is not None and any_family):
            raise UnsupportedConvention(
                f"{self.spec} implements {self.algorithm.title}; this model trains with reference.Muon only"
            )
        if self.max_world is not None and spec.world_size > self.max_world:
            raise UnsupportedConvention(
                f"{self.spec} supports world sizes up to {self.max_world}; the model needs {spec.world_size}"
            )
        missing = {"adamw"} - self.features if self.algorithm.hybrid else set()
        if getattr(spec, "wrapping", None) == "stacked":
            missing |= {"experts"} - self.features
        if missing:
            raise UnsupportedConvention(f"{self.spec} does not declare {sorted(missing)}, which this model needs")
        if PER_RANK in dict(self.conventions).values():
            raise UnsupportedConvention(
                f"{self.spec}: a convention {PER_RANK!r} follows a case's ranks, which a training model's layout does not give"
            )
        if not muon:
            return replace(spec, candidate=self.factory, reference=self.algorithm.in_case, settings=self.conventions)
        settings = {**dict(spec.settings), **dict(self.conventions)}
        return replace(spec, candidate=self.factory, settings=tuple(settings.items()))

    def _narrow(self, p: ParamSpec, notes: list[str]) -> ParamSpec:
        if len(p.shape) == 3 and "experts" not in self.features:
            notes.append(f"{p.name} {list(p.shape)} → one expert {list(p.shape[1:])} (experts not declared)")
            p = p._replace(shape=p.shape[1:])
        if p.dtype == "bfloat16" and "bf16" not in self.features:
            notes.append(f"{p.name} bfloat16 → float32 (bf16 not declared)")
            p = p._replace(dtype="float32")
        if p.grad in _MISSING_KINDS and self.needs_every_grad:
            notes.append(f"{p.name} grad={p.grad} → a gradient on every step (needs_every_grad)")
            p = p._replace(grad="normal")
        return p
