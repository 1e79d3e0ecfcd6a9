"""Putting another team's sharded optimizer (``--impl MODULE:FACTORY``) through the gates.

The contract, for ``FACTORY``:

* it is called as ``FACTORY(param_groups, **settings)`` and returns a
  ``torch.optim.Optimizer``. ``param_groups`` is a list of dicts with ``params`` (FSDP2
  DTensor parameters, ``(Shard(0),)`` on a 1-D mesh; also on a 1-rank mesh at world
  size 1), ``param_names`` and ``use_muon`` (Muon for hidden matrices, AdamW otherwise).
  ``settings`` are ``reference.Muon``'s keywords: ``lr, weight_decay, momentum,
  nesterov, ns_steps, eps`` and the convention settings;
* it may declare, as attributes:

  - ``muongate_conventions``: the conventions it implements, as ``reference.Muon``
    settings (e.g. ``{"momentum_form": "ema", "eps_form": "clamp"}``). Every case uses
    them for both sides, so the reference is configured to match. A key the reference
    does not know is reported (the gates skip, naming it), never compared silently;
  - ``muongate_max_world``: the largest world size it supports (default: any);
  - ``muongate_features``: which of ``"adamw"``, ``"experts"`` (3-D parameters),
    ``"bf16"``, ``"checkpoint"``, ``"no_grad"`` it supports (default: all). Cases are
    narrowed to these, not rejected.
* its ``state[p]`` may hold ``momentum_buffer`` (and ``exp_avg``, ``exp_avg_sq``) with
  the parameter's layout; those are compared too when present.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from harness.cases import Case, ParamSpec
from reference import MUON_DEFAULTS

FEATURES = frozenset({"adamw", "experts", "bf16", "checkpoint", "no_grad"})


def load_declared(option: str, spec: str) -> tuple[Any, dict[str, Any]]:
    """Imports the callable ``spec`` names for ``--option`` and the ``muongate_conventions`` it declares."""
    from harness.tasks import load_object

    obj = load_object(spec)
    if not callable(obj):
        raise TypeError(f"--{option} {spec}: {obj!r} is not callable")
    return obj, dict(getattr(obj, "muongate_conventions", {}))


class UnsupportedConvention(Exception):
    """The candidate declares a convention the reference cannot express."""


@dataclass(frozen=True)
class Impl:
    """A candidate optimizer and what it declared about itself."""

    spec: str
    conventions: tuple[tuple[str, Any], ...] = ()
    max_world: int | None = None
    features: frozenset[str] = FEATURES

    @classmethod
    def load(cls, spec: str) -> Impl:
        """Imports ``MODULE:FACTORY`` and reads its declarations; errors name what is wrong."""
        factory, conventions = load_declared("impl", spec)
        features = frozenset(getattr(factory, "muongate_features", FEATURES))
        unknown_features = features - FEATURES
        if unknown_features:
            raise ValueError(
                f"--impl {spec}: unknown muongate_features {sorted(unknown_features)}; known: {sorted(FEATURES)}"
            )
        return cls(spec, tuple(sorted(conventions.items())), getattr(factory, "muongate_max_world", None), features)

    def unsupported_conventions(self) -> list[str]:
        return sorted(k for k, _ in self.conventions if k not in MUON_DEFAULTS)

    def adapt(self, case: Case) -> Case:
        """The case narrowed to what this candidate declared it supports, on its conventions."""
        if self.unsupported_conventions():
            raise UnsupportedConvention(
                f"{self.spec} declares conventions the reference cannot express: {self.unsupported_conventions()}"
            )
        params = [self._narrow(p) for p in case.params if p.use_muon or "adamw" in self.features]
        world = case.world_size if self.max_world is None else min(case.world_size, self.max_world)
        settings = dict(case.settings)
        for key, value in self.conventions:
            settings[key] = str(value).removeprefix("torch.") if key == "ns_dtype" else value
        return replace(
            case,
            params=tuple(params),
            candidate=self.spec,
            mode=None,
            world_size=world,
            mesh=(world,),
            settings=tuple(settings.items()),
            checkpoint_after=case.checkpoint_after if "checkpoint" in self.features else None,
        )

    def adapt_training(self, spec: Any) -> Any:
        """A training spec (MoE scenario, transformer) run with this candidate on its conventions;
        ``UnsupportedConvention`` when it cannot take the model's world size or parameters."""
        if self.unsupported_conventions():
            raise UnsupportedConvention(
                f"{self.spec} declares conventions the reference cannot express: {self.unsupported_conventions()}"
            )
        if self.max_world is not None and spec.world_size > self.max_world:
            raise UnsupportedConvention(
                f"{self.spec} supports world sizes up to {self.max_world}; the model needs {spec.world_size}"
            )
        missing = {"adamw"} - self.features
        if getattr(spec, "wrapping", None) == "stacked":
            missing |= {"experts"} - self.features
        if missing:
            raise UnsupportedConvention(f"{self.spec} does not declare {sorted(missing)}, which this model needs")
        settings = dict(spec.settings)
        for key, value in self.conventions:
            settings[key] = getattr(torch, str(value).removeprefix("torch.")) if key == "ns_dtype" else value
        return replace(spec, candidate=self.spec, settings=tuple(settings.items()))

    def _narrow(self, p: ParamSpec) -> ParamSpec:
        if len(p.shape) == 3 and "experts" not in self.features:
            p = p._replace(shape=p.shape[1:])  # one expert's matrix
        if p.dtype == "bfloat16" and "bf16" not in self.features:
            p = p._replace(dtype="float32")
        if p.grad in ("none", "every_other") and "no_grad" not in self.features:
            p = p._replace(grad="normal")
        return p
