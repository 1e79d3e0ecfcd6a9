"""Negative controls: a known-wrong variant must fail the gates. Hypothesis searches for an
example the gates reject, shrinks it, and the minimal example is written with whether it is
caught; a control the gates pass on every example fails the test."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from hypothesis import Phase, find, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from harness.runner.findings import fail
from harness.runner.record import Recorder
from reports.records import NegativeControl

T = TypeVar("T")


def search(
    recorder: Recorder,
    gate: str,
    strategy: st.SearchStrategy[T],
    caught: Callable[[T], str | None],
    describe: Callable[[T], str],
    *,
    max_examples: int,
    crashes: Sequence[str] = (),
) -> T:
    """Searches ``strategy`` for an example ``caught`` rejects (its reason, or ``None``), shrinks
    it, writes whether the minimal example is caught, and returns it; fails the test unless it is.
    ``crashes``: the first line of each example's crash (filled while it searches), so that a
    control whose examples ended before comparing anything is not said to have passed them."""
    __tracebackhide__ = True
    judged = _OncePerValue(caught)
    try:
        minimal = find(
            strategy,
            lambda x: judged(x) is not None,
            settings=settings(
                max_examples=max_examples, database=None, derandomize=True, phases=[Phase.generate, Phase.shrink]
            ),
        )
    except NoSuchExample:
        if crashes:
            why = f"{len(crashes)} of the examples run ended before comparing anything; the first: {crashes[0]}"
            recorder.write(NegativeControl(gate, False, f"none of {max_examples} examples", why))
            fail(f"{gate}: no example of the known-wrong variant was judged: {why}")
        recorder.write(NegativeControl(gate, False, f"none of {max_examples} examples", "the gates passed every one"))
        fail(f"{gate}: the gates passed a known-wrong variant on all {max_examples} examples tried")
    message = judged(minimal)
    record = NegativeControl(gate, message is not None, describe(minimal), message or "")
    recorder.write(record)
    if not record.detected:
        fail(f"{gate} was not detected on its own minimal example {record.case}")
    return minimal


class _OncePerValue(Generic[T]):
    """``caught``, run once per distinct value (keyed by its pickle, what the ranks receive).
    Hypothesis remembers the choices it tried, not the values they drew: while it shrinks,
    many choices draw an example already judged, each another run on the ranks (a planted
    hang another full wait; each hang control ran its one example three times), and the
    minimal example was run once more for its message. A case's run is deterministic, so the
    verdict is the same."""

    def __init__(self, caught: Callable[[T], str | None]) -> None:
        self._caught = caught
        self._seen: dict[bytes, str | None] = {}

    def __call__(self, value: T) -> str | None:
        key = pickled(value)
        if key is None:  # nothing to key on: run it
            return self._caught(value)
        if key not in self._seen:
            self._seen[key] = self._caught(value)
        return self._seen[key]


def pickled(value: Any) -> bytes | None:
    """``value`` as the ranks receive it, the key by which an equal case or example is known
    again (``_OncePerValue``, ``GateRunner``'s passed cases); ``None`` where it cannot be pickled."""
    try:
        return pickle.dumps(value)
    except Exception:
        return None
