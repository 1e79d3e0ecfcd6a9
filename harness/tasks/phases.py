"""Where a rank's time goes, phase by phase (``benchmarks/case_throughput.py`` reads it)."""

from __future__ import annotations

import time
from typing import Any

from harness.ranks import RankContext


class Phases:
    """Wall-clock seconds per phase of a case on this rank."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._mark = time.perf_counter()

    def lap(self, name: str) -> None:
        """The time since the last lap counts to ``name``."""
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._mark
        self._mark = now

    def keep(self) -> None:
        """These are the last case's phases (``last_phases``)."""
        _LAST.clear()
        _LAST.update(self.seconds)


_LAST: dict[str, float] = {}


def last_phases(ctx: RankContext, payload: Any) -> dict[str, float]:
    """A rank task: where the previous optimizer case's time went on this rank."""
    return dict(_LAST)
