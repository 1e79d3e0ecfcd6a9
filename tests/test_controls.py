"""Claims about the negative controls' search (``harness.runner.controls``)."""

from __future__ import annotations

from collections import Counter

from hypothesis import strategies as st

from harness.runner import controls
from harness.runner.record import Recorder
from reports.stream import ResultStream


def test_a_control_runs_each_distinct_example_once_its_minimal_one_included() -> None:
    """Many of hypothesis's choices draw one value (here a thousand integers, three values); each
    value is a run on the ranks, a planted hang a full wait, so it is judged once."""
    runs: Counter[int] = Counter()

    def caught(value: int) -> str | None:
        runs[value] += 1
        return "differs" if value == 2 else None

    minimal = controls.search(
        Recorder(ResultStream(None)), "negative:three", st.integers(0, 1000).map(lambda i: i % 3), caught, str,
        max_examples=50,
    )  # fmt: skip
    assert minimal == 2
    assert runs == {0: 1, 1: 1, 2: 1}, runs
