"""The one writer of the results stream (``reports.records`` holds every kind it writes), and
each test's figures per gate (``--junitxml`` carries them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from reports.records import NOT_FAILED, CaseResult, Record, Skip, Status
from reports.stream import ResultStream
from reports.summary import GateSummary


@dataclass(repr=False)
class Recorder:
    """Writes records to the session's stream and counts each case into its test's figures."""

    stream: ResultStream
    #: told of every case as it is written (the live display): gate, passed
    on_case: Callable[[str, bool], None] | None = None
    #: per test (node id): the figures of each gate it ran
    figures: dict[str, dict[str, GateSummary]] = field(default_factory=dict)
    _cases: int = 0

    def write(self, record: Record, *, sync: bool = True) -> None:
        self.stream.write(record, sync=sync)

    def skip(self, gate: str, reason: str) -> None:
        self.write(Skip(gate, reason))

    def case(
        self,
        nodeid: str,
        gate: str,
        described: str,
        status: Status,
        message: str,
        seconds: float,
        *,
        reproduce: str,
        judged: str,
        case: Any = None,
        **kw: Any,
    ) -> None:
        """One case's verdict (``case``: what ran, for its narrowing and layout)."""
        self._cases += 1
        record = CaseResult(
            self._cases, gate, described, status, message, round(seconds, 4), reproduce, judged=judged,
            narrowed=tuple(getattr(case, "narrowed", ())), layout=str(getattr(case, "layout", "")), **kw,
        )  # fmt: skip
        self.write(record)
        self.figures.setdefault(nodeid, {}).setdefault(gate, GateSummary(gate)).add(record)
        if self.on_case is not None:
            self.on_case(gate, status in NOT_FAILED)

    def scenario_done(self, gate: str) -> None:
        """A scenario that reached its own verdict (an MoE reproduction) counts as a case shown."""
        if self.on_case is not None:
            self.on_case(gate, True)
