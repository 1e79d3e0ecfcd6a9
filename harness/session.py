"""What the plug-in tells the gate modules about the session: the pool's size and the
algorithm its candidates are judged against. Gate modules draw from it lazily (``drawn``), at
the first example, so that nothing is read at import and no environment variable carries it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hypothesis import strategies as st

T = TypeVar("T")


@dataclass(frozen=True)
class GateConfig:
    """The running session's configuration, as the plug-in resolved it."""

    #: ranks in the pool (``--nproc``, or torchrun's world size)
    nproc: int = 2
    #: the reference the session's candidate is judged against (``harness.algorithms.Algorithm``;
    #: ``None``: ``reference.Muon``)
    algorithm: Any = field(default=None)
    #: the sizes at which the candidate changes behaviour (``Candidate.thresholds``): drawn on both sides
    thresholds: tuple[int, ...] = ()
    #: the ``--engine`` the engine gates judge (``harness.engines.LoadedEngine``; ``None``: muongate's flat engine)
    engine: Any = None
    #: the capture ``--layout-from`` replays (``harness.replay.Replay``; ``None``: none)
    replay: Any = None


_CURRENT = [GateConfig()]


def configure(config: GateConfig) -> None:
    """The plug-in sets the session's configuration (before any gate draws)."""
    _CURRENT[0] = config


def gate_config() -> GateConfig:
    """The running session's configuration."""
    return _CURRENT[0]


def drawn(build: Callable[[GateConfig], st.SearchStrategy[T]]) -> st.SearchStrategy[T]:
    """A strategy built from the session's configuration when the first example is drawn."""
    return st.deferred(lambda: build(gate_config()))
