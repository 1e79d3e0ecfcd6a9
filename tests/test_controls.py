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


def test_a_control_whose_every_example_crashed_is_said_to_have_judged_nothing_not_to_have_passed() -> None:
    """DeepSpeed's planted controls drew 2-rank cases on a 4-rank pool, where every case raised
    before comparing anything (2026-12-07): the failure said the gates "passed a known-wrong
    variant on all 300 examples". It now says none was judged, and why the first ended."""
    import pytest

    crashes: list[str] = []

    def caught(value: int) -> str | None:
        crashes.append("error on rank 0: ValueError: DeepSpeed talks over the default process group")
        return None

    with pytest.raises(pytest.fail.Exception) as failed:
        controls.search(
            Recorder(ResultStream(None)), "negative:crashing", st.integers(0, 3), caught, str,
            max_examples=10, crashes=crashes,
        )  # fmt: skip
    said = str(failed.value)
    assert "no example of the known-wrong variant was judged" in said and "passed" not in said, said
    assert "DeepSpeed talks over the default process group" in said, said
