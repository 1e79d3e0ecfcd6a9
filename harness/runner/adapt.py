"""A drawn case made into the case that runs: on the session's candidate (narrowed to what it
declared, on its conventions), with the session's kernel, and judged against the candidate
on one device under ``--against self``. Where the candidate cannot take the case at all, the
test skips, saying why."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest

from harness import layouts
from harness.candidates import Impl, Kernel, UnsupportedConvention, declaration_of
from harness.cases import Case, ReshardCase
from harness.tasks.training import AroundSpec

#: the tasks ``--against self`` also runs on one device
SELF_JUDGED = ("optimizer", "routing", "backward")


@dataclass(frozen=True)
class Adaptation:
    """The session's candidate and kernel (``None``: the built-in ones), ``--against``, and the pool's size."""

    impl: Impl | None
    kernel: Kernel | None
    against: str
    nproc: int

    def __call__(self, case: Any, task: str) -> Any:
        """The case as it runs for ``task``."""
        case = _own(self._resolve(case))
        if self.against == "self" and task in SELF_JUDGED and isinstance(case, Case):
            case = replace(case, self_reference=True)
        return case

    def narrowed(self, case: Case) -> list[str]:
        """What the candidate's narrowing and declared conventions change in ``case``."""
        if self.impl is None:
            return []
        return [*self._resolve(case).narrowed, *self.impl.overridden(case)]

    def _resolve(self, case: Any) -> Any:
        if self.kernel is not None and isinstance(case, Case) and case.kernel is None:
            case = replace(case, kernel=self.kernel.spec)
        if self.impl is None or getattr(case, "candidate", ...) is not None:
            return case
        if isinstance(case, Case) and case.kernel:
            pytest.skip(f"{self.impl.spec} brings its own Newton–Schulz: kernel gates run ShardedMuon only")
        try:
            if isinstance(case, ReshardCase):
                return self._reshard(case)
            if isinstance(case, AroundSpec):
                return replace(case, spec=self.impl.adapt_training(case.spec))
            if isinstance(case, Case):
                return self.impl.adapt(case, self.nproc)
            return self.impl.adapt_training(case)
        except UnsupportedConvention as e:
            pytest.skip(str(e))

    def _reshard(self, case: ReshardCase) -> ReshardCase:
        """Both sides of a resharding case on the candidate; skipped where either is narrowed."""
        assert self.impl is not None
        sides = [self.impl.adapt(c, self.nproc) for c in (case.before, case.after)]
        narrowed = [n for side in sides for n in side.narrowed]
        if narrowed:
            pytest.skip(f"reshard: not run: narrowed for {self.impl.spec}: {'; '.join(narrowed)}")
        return replace(case, before=sides[0], after=sides[1])


def _own(case: Any) -> Any:
    """``case`` (a resharding case: both sides) given to ``layouts.OWN`` where it is FSDP2's on a
    1-D mesh and its candidate declares a ``shard`` of its own: the one place a case learns how
    its candidate lays itself out, so that a case itself never reads its candidate."""
    if isinstance(case, ReshardCase):
        return replace(case, before=_own(case.before), after=_own(case.after))
    flat = isinstance(case, Case) and case.layout in (layouts.FSDP, layouts.EXPERTS)
    if flat and declaration_of(case.candidate).shard is not None:
        return replace(case, layout=layouts.OWN)
    return case
