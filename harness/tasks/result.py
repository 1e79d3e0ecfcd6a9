"""What every rank task returns to the parent: one type, so the runner handles one shape."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reports.records import Comparison


@dataclass(frozen=True)
class TaskResult:
    """A rank's comparisons (``reports.records.Comparison``), the figures it measured besides
    them (loss curves, singular values, finiteness), as plain values, and its routes."""

    comparisons: tuple[Comparison, ...] = ()
    figures: Mapping[str, Any] = field(default_factory=dict)
    #: which algorithm stepped each parameter on this rank (``harness.tasks.routing.Route``)
    routes: tuple[Any, ...] = ()
