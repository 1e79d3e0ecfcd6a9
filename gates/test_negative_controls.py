"""Claims: every known-wrong sharded Muon in ``negative_controls.py`` fails the gates, and
hypothesis shrinks the failure to a small case.

A gate that cannot fail proves nothing. Each control plants one bug; hypothesis's
``find`` searches the same case space the real gates draw from for a case the gate
rejects, and shrinks it. The minimal case is written to the results stream, so the
report shows what each control was caught on.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import Phase, find, settings

from gates.negative_controls import NEGATIVE_CONTROLS
from harness.cases import Case, cases
from harness.runner import verdict_message

pytestmark = pytest.mark.gate

NPROC = int(os.environ.get("MUONGATE_NPROC", "2"))


@pytest.mark.parametrize("control", sorted(NEGATIVE_CONTROLS))
def test_gates_catch_negative_control(gate_runner: Any, control: str) -> None:
    if NPROC < 2:
        pytest.skip("every planted bug needs at least two ranks to show")
    candidate = NEGATIVE_CONTROLS[control]

    def caught(case: Case) -> bool:
        planted = replace(case, candidate=candidate, mode=None, world_size=2, mesh=(2,))
        outcome, records = gate_runner.outcome(f"negative:{control}", planted, record=False)
        return verdict_message(planted, outcome, records) is not None

    minimal = find(
        cases(max_world=2, max_steps=3, max_params=2, adamw=False),
        caught,
        settings=settings(max_examples=300, database=None, derandomize=True, phases=[Phase.generate, Phase.shrink]),
    )
    planted = replace(minimal, candidate=candidate, mode=None, world_size=2, mesh=(2,))
    outcome, records = gate_runner.outcome(f"negative:{control}", planted, record=False)
    message = verdict_message(planted, outcome, records)
    gate_runner.stream.write(
        {
            "kind": "negative_control",
            "gate": f"negative:{control}",
            "detected": message is not None,
            "case": planted.describe(),
            "message": message or "",
        },
        sync=True,
    )
    assert message is not None, f"{control} was not detected on its own minimal case {planted.describe()}"
    assert sum(p.shape[0] for p in planted.params) <= 64, f"{control}: shrinking left a large case {planted.describe()}"
