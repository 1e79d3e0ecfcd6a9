"""Which tests run for the session's candidate, and why the others skip: every skip names the
gate and what the candidate did not declare (or what the session's options rule out)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from harness.algorithms import built_in, built_in_factory
from harness.candidates import MISSING_GRADS, Impl
from harness.candidates.declaration import declaration_of
from harness.runner.adapt import SELF_JUDGED

#: tasks whose model the harness lays out with ``fully_shard`` (not a candidate's own ``shard``)
TASKS_OF_MODELS = ("backward", "training", "twins", "pipeline")


@dataclass(frozen=True)
class SkipPolicy:
    """The session's candidate (``None``: the built-in one), what it is judged against, and the ranks' device."""

    impl: Impl | None
    against: str
    device: str
    #: the session's family (``harness.algorithms.Algorithm``)
    algorithm: Any = None

    def runnable(self, gate: str, task: str = "optimizer") -> None:
        """Skips unless the candidate's conventions are the reference's to express, the ranks'
        device type is one it declared, and (for a task of models) it takes FSDP2's layout."""
        if self.impl is not None and self.impl.inexpressible:
            reasons = "; ".join(self.impl.inexpressible)
            pytest.skip(
                f"{gate}: not run: {self.impl.spec} declares conventions the reference cannot express: {reasons}"
            )
        kind = torch.device(self.device).type
        self.require(gate, {kind}, f"its ranks run on {kind}")
        if task in TASKS_OF_MODELS:
            self.require(gate, {"fully_shard"}, "its model is laid out by FSDP2's fully_shard")
        if task not in SELF_JUDGED and self.impl is not None and self.impl.algorithm.factory is None:
            pytest.skip(f"{gate}: compares with a reference, and the session has none (--reference none)")

    def declares(self, gate: str, field: str, what: str) -> None:
        """Skips unless the candidate (the built-in one without ``--impl``) declares ``field`` of
        its ``Candidate`` (a ``clip`` of its own): the claim is about ``what``."""
        spec = self.impl.spec if self.impl is not None else built_in(self.algorithm)
        factory = self.impl.factory if self.impl is not None else built_in_factory(self.algorithm)
        if getattr(declaration_of(factory), field) is None:
            pytest.skip(f"{gate}: {spec} declares no {what} of its own (Candidate.{field})")

    def require(self, gate: str, features: set[str], why: str) -> None:
        """Skips when the candidate did not declare what the claim is about."""
        missing = self.impl.missing(features) if self.impl else []
        if missing:
            assert self.impl is not None
            undeclared = ["more than one rank" if m == "world" else m for m in missing if m != MISSING_GRADS]
            said = [f"does not declare {', '.join(undeclared)}"] if undeclared else []
            said += ["declares needs_every_grad (a gradient for every parameter)"] if MISSING_GRADS in missing else []
            pytest.skip(f"{gate}: not run: {why}, and {self.impl.spec} {' and '.join(said)}")

    def reference_only(self, gate: str) -> None:
        """Skips under ``--against self``: the test can only compare with the reference."""
        if self.against == "self":
            pytest.skip(f"{gate}: compares with the reference only; --against self judges the optimizer gates")

    def algorithm_claim(self, gate: str, about: str) -> None:
        """Skips unless the session's reference declares the claim ``gate`` (``CLAIMS``): it is about ``about``."""
        algorithm = self.algorithm
        if gate not in algorithm.claims:
            pytest.skip(f"{gate}: a claim of {about}, which {algorithm.title} does not declare (its CLAIMS)")

    def exact(self, gate: str, narrowed: list[str]) -> None:
        """Skips a hand-picked case whose point the candidate's narrowing removed."""
        if narrowed:
            assert self.impl is not None
            pytest.skip(f"{gate}: not run: narrowed for {self.impl.spec}: {'; '.join(narrowed)}")
