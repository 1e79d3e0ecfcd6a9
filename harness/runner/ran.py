"""What a case that ran is, and its verdict: the pool's outcome, every rank's comparisons, rank 0's figures."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from harness.algorithms import reference_of
from harness.ranks import CaseOutcome
from reports.records import Comparison, Status, finding_of


class RankCase(Protocol):
    """What every kind of case a rank task takes has (``Case``, ``ReshardCase``, ``KernelCase``,
    ``TwinsCase``, ``PipelineCase``, a training spec): frozen and picklable, the ranks it needs, and its
    description, and the reference class it is judged against (``harness.algorithms.reference_of``).
    The runner reads anything else a kind may carry (``narrowed``, ``candidate``, ``layout``)
    where it is there."""

    @property
    def world_size(self) -> int: ...

    @property
    def reference(self) -> Any: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class Ran:
    """A case that ran: the pool's outcome, every rank's comparisons, rank 0's figures, and
    every rank's routes (``harness.tasks.routing.Route``)."""

    case: RankCase
    outcome: CaseOutcome
    comparisons: tuple[Comparison, ...]
    figures: Mapping[str, Any] = field(default_factory=dict)
    routes: tuple[Any, ...] = ()

    @property
    def against(self) -> str:
        """What the case is judged against: ``self`` (the candidate on one device) or ``reference``."""
        return "self" if getattr(self.case, "self_reference", False) else "reference"

    @property
    def judged(self) -> tuple[Comparison, ...]:
        """The comparisons the verdict rests on (the others are shown beside it)."""
        return tuple(c for c in self.comparisons if c.against == self.against)

    @property
    def status(self) -> Status:
        if self.outcome.failure is not None:
            return self.outcome.failure.status
        return "passed" if self.message is None else "failed"

    @property
    def kind(self) -> str:
        """The kind of finding (``harness.runner.findings.FINDINGS``) this case is, if it failed:
        the report's own name for it (``reports.records.finding_of``)."""
        return finding_of(self.status, self.comparisons, self.against)

    @property
    def message(self) -> str | None:
        """``None`` when the case passed; otherwise what went wrong, worst comparison first."""
        if self.outcome.failure is not None:
            return self.outcome.failure.describe()
        judged = self.judged
        if not judged:
            return "the case compared nothing"
        if all(c.all_zero or c.numel == 0 for c in judged):
            return "every comparison was of all-zero or empty tensors: the case compares nothing"
        bad = sorted((c for c in judged if not c.passed), key=lambda c: (-c.max_ulp, c.step, c.tensor))
        if not bad:
            return None
        what = "the candidate on one device" if self.against == "self" else reference_of(self.case).title
        lines = [f"{len(bad)} of {len(judged)} comparisons with {what} failed; worst first:"]
        lines += [f"  {c.line()}" for c in bad[:8]]
        return "\n".join(lines)


def differed(ran: Ran) -> str | None:
    """What differed where the case ran to the end and some comparison failed; ``None`` where it
    passed or crashed. A negative control whose bug is a wrong value is caught by this alone: a
    crash of the planted code proves nothing about the gate."""
    if ran.outcome.failure is not None or not any(not c.passed for c in ran.judged):
        return None
    return ran.message


def robust_finding(ran: Ran) -> tuple[str | None, str]:
    """A robustness verdict: ``(None, why it passed)``, or the kind of finding and its message.
    An error that names a parameter of the case (quoted, as ``repr`` gives it) is a clear
    refusal and passes; any other error, a hang, an abort or a difference fails."""
    failure = ran.outcome.failure
    if failure is None:
        return (None, "") if ran.message is None else (ran.kind, ran.message)
    text = failure.describe()
    if failure.status != "error":
        return failure.status, text
    params = getattr(ran.case, "params", ())
    named = [p.name for p in params if repr(p.name) in text or f'"{p.name}"' in text]
    if named:
        return None, f"refused with an error naming {named}: {failure.headline()}"
    return "error", f"{text}\nthe error names no parameter of the case"
