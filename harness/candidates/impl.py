"""Putting another team's sharded optimizer (``--impl MODULE:FACTORY``) through the gates.

The contract, for ``FACTORY``:

* it is called as ``FACTORY(param_groups, **settings)`` and returns a
  ``torch.optim.Optimizer``. ``param_groups`` is a list of dicts with ``params`` (FSDP2
  DTensor parameters, ``(Shard(0),)`` on a 1-D mesh, also on a 1-rank mesh at world size
  1; and the layouts it declares in ``muongate_layouts``, as those layouts' DTensors),
  ``param_names`` and ``use_muon`` (Muon for hidden matrices, AdamW otherwise).
  ``settings`` are ``reference.Muon``'s keywords: ``lr, weight_decay, momentum,
  nesterov, ns_steps, eps`` and the convention settings;
* it may declare, as attributes:

  - ``muongate_conventions``: the conventions it implements, as ``reference.Muon``
    settings (e.g. ``{"momentum_form": "ema", "eps_form": "clamp"}``). Every case uses
    them for both sides, so the reference is configured to match. A key the reference
    does not know, or a value it cannot take, is reported (the gates skip, naming it),
    never compared silently;
  - ``muongate_max_world``: the largest world size it supports (default: any);
  - ``muongate_min_ns_steps``: the fewest Newton–Schulz iterations it takes, for one that
    refuses fewer by name (default: 0); a case's ``ns_steps`` below it is raised to it;
  - ``muongate_features``: which of ``"adamw"``, ``"experts"`` (3-D parameters),
    ``"bf16"``, ``"checkpoint"``, ``"fully_shard"`` (with ``muongate_shard`` only, below)
    it supports (default: all). Cases are narrowed to
    these, not rejected, and every narrowing is reported. (A parameter without a
    gradient is not a feature: every candidate meets one, and the robustness gates hold
    it to leaving that parameter exactly as it was.)
  - ``muongate_layouts``: which layouts beyond FSDP2's it takes, of ``"hsdp"`` (a 2-D
    ``(replicate, shard)`` mesh), ``"tp"`` (tensor parallel alone: ``parallelize_module``'s
    ``Shard(0)``, ``Shard(1)``, ``Replicate()`` on a 1-D mesh) and ``"fsdp_tp"`` (TP, then
    ``fully_shard`` on a ``dp`` dim: ``_StridedShard``), ``"hsdp_tp"`` (TP, then HSDP's
    ``fully_shard`` on ``(rep, dp)`` of a 3-D mesh) and ``"ep_efsdp"`` (3-D expert
    stacks split by experts over ``ep`` and by rows over ``efsdp``); default none. Cases of other
    layouts are narrowed to FSDP2 on a 1-D mesh, and the layout gate skips;
  - ``muongate_tiers``: the calibrated tiers its arithmetic differs from the reference's
    within, by design: ``"gram_partial"`` (the Gram matrix ``X Xᵀ`` of a row-wise TP weight
    from per-rank partial products and an all-reduce, ``harness.compare.GRAM_PARTIAL``).
    It does not excuse the candidate from any bitwise gate; it adds the tier's gate;
  - ``muongate_shard``: ``muongate_shard(module, mesh)`` shards ``module``'s parameters
    itself, in place and its own way, on the ranks of ``mesh`` (the case's 1-D mesh, dim
    ``shard``: it may build a mesh of its own over ``mesh.get_group()``), instead of the
    harness's ``fully_shard``: bring-your-own sharding. Afterwards each parameter is either
    a DTensor, read through its own mesh and placements as FSDP2's are, or a plain tensor
    holding this rank's piece, which ``muongate_piece(name, param)`` (also an attribute of
    the factory) names as a tuple of slices of the full tensor. Gradients arrive laid out
    the same way, and optimizer state is read with its parameter's layout. Its cases are of
    the layout family ``own``; layouts it does not declare in ``muongate_layouts`` are
    narrowed to its own sharding on a 1-D mesh. The gates whose model FSDP2 lays out (a real
    backward, training, MoE) run it only if it also declares the feature ``"fully_shard"``
    (it steps FSDP2's own parameters too);
  - ``muongate_default_group``: ``True`` when it talks over the default process group (as
    optimizers written for DDP do) rather than its parameters' meshes: every case then runs
    on all the ranks there are, and a case of fewer is widened to them (reported as narrowed);
  - ``muongate_devices``: the device types its ranks may run on, of ``"cpu"`` and
    ``"cuda"`` (default: both); on another, every gate skips, naming it;
  - ``muongate_differences``: the known causes its arithmetic differs from the reference's
    by, of ``harness.causes.CAUSES`` (``"plain_quintic"``, ``"scaled_update"``,
    ``"bf16_momentum"``). It still fails every bitwise gate; the cause gate then holds its
    update to a tier calibrated on those causes, per setting, so a bug cannot hide in the
    known difference;
  - ``muongate_single_device``: a factory of the same contract for plain (not
    DTensor) parameters on one device, its own single-device counterpart, which
    ``--against self`` compares it with; without it, the candidate itself runs on a
    one-rank FSDP2 mesh.
* its ``state[p]`` may hold ``momentum_buffer`` (and ``exp_avg``, ``exp_avg_sq``) with
  the parameter's layout; those are compared too when present.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from harness.algorithms import MUON, Algorithm, reference_of
from harness.candidates.loading import load_declared
from harness.cases.case import Case, ParamSpec, optimizer_settings, stored_setting

FEATURES = frozenset({"adamw", "experts", "bf16", "checkpoint", "fully_shard"})
LAYOUTS = frozenset({"hsdp", "tp", "fsdp_tp", "hsdp_tp", "ep_efsdp"})
TIERS = frozenset({"gram_partial"})
DEVICES = frozenset({"cpu", "cuda"})


class UnsupportedConvention(Exception):
    """The candidate declares a convention the reference cannot express."""


def _reference(spec: str, factory: Any) -> Algorithm:
    """The reference a candidate implements: its ``muongate_reference`` (a reference class, or
    ``MODULE:CLASS``), else ``reference.Muon``."""
    declared = getattr(factory, "muongate_reference", None)
    if declared is None:
        return MUON
    try:
        return Algorithm.load(declared) if isinstance(declared, str) else Algorithm.of(declared)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"--impl {spec}: muongate_reference {declared!r}: {e}") from e


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
    #: the reference it implements (``muongate_reference``)
    algorithm: Algorithm = MUON

    @classmethod
    def load(cls, spec: str) -> Impl:
        """Imports ``MODULE:FACTORY`` and reads its declarations; errors name what is wrong."""
        factory, declared = load_declared("impl", spec)
        features = frozenset(getattr(factory, "muongate_features", FEATURES))
        unknown_features = features - FEATURES
        if unknown_features:
            raise ValueError(
                f"--impl {spec}: unknown muongate_features {sorted(unknown_features)}; known: {sorted(FEATURES)}"
            )
        layouts = frozenset(getattr(factory, "muongate_layouts", ()))
        if layouts - LAYOUTS:
            raise ValueError(
                f"--impl {spec}: unknown muongate_layouts {sorted(layouts - LAYOUTS)}; known: {sorted(LAYOUTS)}"
            )
        tiers = frozenset(getattr(factory, "muongate_tiers", ()))
        if tiers - TIERS:
            raise ValueError(f"--impl {spec}: unknown muongate_tiers {sorted(tiers - TIERS)}; known: {sorted(TIERS)}")
        devices = frozenset(getattr(factory, "muongate_devices", DEVICES))
        if not devices or devices - DEVICES:
            raise ValueError(f"--impl {spec}: muongate_devices {sorted(devices)} must be some of {sorted(DEVICES)}")
        from harness.causes import CAUSES

        differences = frozenset(getattr(factory, "muongate_differences", ()))
        if differences - CAUSES.keys():
            raise ValueError(
                f"--impl {spec}: unknown muongate_differences {sorted(differences - CAUSES.keys())}; known: {sorted(CAUSES)}"
            )
        own_sharding = hasattr(factory, "muongate_shard")
        if own_sharding and not callable(factory.muongate_shard):
            raise TypeError(f"--impl {spec}: muongate_shard must be callable as muongate_shard(module, mesh)")
        min_ns_steps = getattr(factory, "muongate_min_ns_steps", 0)
        if not isinstance(min_ns_steps, int) or min_ns_steps < 0:
            raise ValueError(f"--impl {spec}: muongate_min_ns_steps {min_ns_steps!r} must be a whole number ≥ 0")
        conventions = {k: stored_setting(k, v) for k, v in declared.items()}
        algorithm = _reference(spec, factory)
        return cls(
            spec,
            factory,
            tuple(sorted(conventions.items())),
            getattr(factory, "muongate_max_world", None),
            features,
            tuple(algorithm.check(optimizer_settings(conventions.items()))),
            layouts,
            tiers,
            own_sharding,
            devices,
            bool(getattr(factory, "muongate_default_group", False)),
            differences,
            min_ns_steps,
            algorithm,
        )

    @property
    def declares_reference(self) -> bool:
        """Whether the candidate names the reference it implements (``muongate_reference``)."""
        return hasattr(self.factory, "muongate_reference")

    def judged_against(self, algorithm: Algorithm) -> Impl:
        """This candidate judged against ``algorithm`` (``--reference``), its conventions checked there."""
        if algorithm.spec == self.algorithm.spec:
            return self
        inexpressible = tuple(algorithm.check(optimizer_settings(self.conventions)))
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
            notes.append(f"world {case.world_size} → {world} (muongate_max_world {self.max_world})")
        if self.default_group and pool_world is not None and world != pool_world:
            notes.append(f"world {world} → {pool_world} (muongate_default_group: it talks to every rank)")
            world = pool_world
        layout = self._layout(case)
        flat = layout not in self.layouts or world != case.world_size
        if case.mesh != (case.world_size,) and flat:
            notes.append(f"mesh {list(case.mesh)} → [{world}] ({layout} not declared in muongate_layouts)")
        if (case.tp > 1 or case.ep > 1) and flat:
            alone = "its own sharding (muongate_shard)" if self.own_sharding else "FSDP2 alone"
            notes.append(f"{case.layout} → {alone} ({layout} not declared in muongate_layouts)")
        settings = dict(case.settings)
        if settings.get("ns_steps", self.min_ns_steps) < self.min_ns_steps:
            notes.append(f"ns_steps {settings['ns_steps']} → {self.min_ns_steps} (muongate_min_ns_steps)")
            settings["ns_steps"] = self.min_ns_steps
        checkpoint = case.checkpoint_after if "checkpoint" in self.features else None
        if checkpoint != case.checkpoint_after:
            notes.append("checkpoint round trip left out (checkpoint not declared)")
        return replace(
            case,
            params=tuple(params),
            candidate=self.factory,
            mode=None,
            world_size=world,
            mesh=(world,) if flat else case.mesh,
            tp=1 if flat else case.tp,
            ep=1 if flat else case.ep,
            settings=tuple({**settings, **dict(self.conventions)}.items()),
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

    @staticmethod
    def _layout(case: Case) -> str:
        """The case's layout family by the name ``muongate_layouts`` uses for it."""
        names = {"fsdp×tp": "fsdp_tp", "hsdp×tp": "hsdp_tp", "ep×efsdp": "ep_efsdp", "3-D": "fsdp", "own": "fsdp"}
        return names.get(case.layout, case.layout)

    def missing(self, features: set[str]) -> list[str]:
        """Which of ``features``, layouts, tiers, devices and ``"world"`` (more than one rank) this candidate did not declare."""
        declared = self.features if self.own_sharding else self.features | {"fully_shard"}
        gone = sorted(features & FEATURES - declared) + sorted(features & LAYOUTS - self.layouts)
        gone += sorted(features & TIERS - self.tiers) + sorted(features & DEVICES - self.devices)
        if "world" in features and self.max_world is not None and self.max_world < 2:
            gone.append("world")
        return gone

    def adapt_training(self, spec: Any) -> Any:
        """A training spec (MoE scenario, transformer) run with this candidate on its conventions;
        ``UnsupportedConvention`` when it cannot take the model's world size or parameters."""
        self._check_expressible()
        if self.max_world is not None and spec.world_size > self.max_world:
            raise UnsupportedConvention(
                f"{self.spec} supports world sizes up to {self.max_world}; the model needs {spec.world_size}"
            )
        missing = {"adamw"} - self.features
        if getattr(spec, "wrapping", None) == "stacked":
            missing |= {"experts"} - self.features
        if missing:
            raise UnsupportedConvention(f"{self.spec} does not declare {sorted(missing)}, which this model needs")
        settings = {**dict(spec.settings), **dict(self.conventions)}
        return replace(spec, candidate=self.factory, settings=tuple(settings.items()))

    def _narrow(self, p: ParamSpec, notes: list[str]) -> ParamSpec:
        if len(p.shape) == 3 and "experts" not in self.features:
            notes.append(f"{p.name} {list(p.shape)} → one expert {list(p.shape[1:])} (experts not declared)")
            p = p._replace(shape=p.shape[1:])
        if p.dtype == "bfloat16" and "bf16" not in self.features:
            notes.append(f"{p.name} bfloat16 → float32 (bf16 not declared)")
            p = p._replace(dtype="float32")
        return p
