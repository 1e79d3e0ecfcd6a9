"""What the plug-in tells the gate modules about the session: the pool's size and the
algorithm its candidates are judged against. Gate modules draw from it lazily (``drawn``), at
the first example, so that nothing is read at import and no environment variable carries it.

The configuration belongs to the pytest session: its ``harness.plugin.gate_session.GateSession``
(``gate_config``, refined as the session resolves its plug-ins), and a session is the current
one only while it collects and runs tests (a ``ContextVar`` the plug-in sets and resets around them), so that nothing outlives a session and a session that
pytester starts inside another one reads its own. Read where no session is running,
``gate_config`` raises instead of answering with defaults."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import strategies as st

from harness.plugin import GateConfig, running_config, session_of

__all__ = ["GateConfig", "drawn", "gate_config"]

T = TypeVar("T")


def gate_config() -> GateConfig:
    """The running session's configuration (``harness.plugin.running_config``: an error where none runs)."""
    return session_of(running_config()).gate_config


def drawn(build: Callable[[GateConfig], st.SearchStrategy[T]]) -> st.SearchStrategy[T]:
    """A strategy built from the running session's configuration when its first example is drawn,
    once per session (a session pytester starts inside another builds its own)."""
    built: weakref.WeakKeyDictionary[Any, st.SearchStrategy[T]] = weakref.WeakKeyDictionary()

    @st.composite
    def per_session(draw: st.DrawFn) -> T:
        config = running_config()
        if config not in built:
            built[config] = build(gate_config())
        return draw(built[config])

    return per_session()
