"""Claims: every known-wrong sharded Muon in ``negative_controls.py`` fails the gates, and
hypothesis shrinks the failure to a small case; the same optimizer without a bug passes.

A gate that cannot fail proves nothing. Each control plants one bug; hypothesis's
``find`` searches the same case space the real gates draw from for a case the gate
rejects, and shrinks it. The minimal case goes into the report, so it shows what each
control was caught on.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings

from gates.negative_controls import NEGATIVE_CONTROLS, PlantedMuon, ShardSumNormMuon
from harness.cases import Case, cases, norm_tie_cases
from harness.session import gate_config

pytestmark = [
    pytest.mark.gate,
    pytest.mark.judges("muongate's own gates, with planted bugs (negative controls)", "muongate: gates"),
]

CONTROL_CASES = cases(max_world=2, max_steps=3, max_params=2, adamw=False)


def _planted(case: Case, control: type[PlantedMuon]) -> Case:
    return replace(case, candidate=control, mode=None, world_size=2, mesh=(2,))


@given(case=CONTROL_CASES)
@settings(max_examples=max(5, settings().max_examples // 10))
def test_unplanted_control_matches_the_reference(gate_runner: Any, case: Case) -> None:
    """The optimizer the controls are built on is correct: each bug is the only difference."""
    if gate_config().nproc < 2:
        pytest.skip("the controls run on two ranks")
    gate_runner.check("negative:unplanted", _planted(case, PlantedMuon))


@pytest.mark.parametrize("control", sorted(NEGATIVE_CONTROLS))
def test_gates_catch_negative_control(gate_runner: Any, control: str) -> None:
    if gate_config().nproc < 2:
        pytest.skip("every planted bug needs at least two ranks to show")
    planted = NEGATIVE_CONTROLS[control]
    minimal = gate_runner.catch(
        f"negative:{control}",
        CONTROL_CASES,
        lambda case: gate_runner.run(_planted(case, planted)).message,
        lambda case: _planted(case, planted).describe(),
    )
    size = sum(p.shape[0] for p in minimal.params)
    assert size <= 64, f"{control}: shrinking left a large case {_planted(minimal, planted).describe()}"


def test_norm_ties_catch_the_shard_sum_norm_with_bf16_newton_schulz_only(gate_runner: Any) -> None:
    """The shard-sum norm under a bf16-only declaration: every case has bf16 Newton–Schulz, so
    only the norm-tie inputs can show the last-bit difference (on the ordinary generators
    with ``ns_dtype`` fixed to bf16 it passed 300 of 300 cases: see the README)."""
    if gate_config().nproc < 2:
        pytest.skip("the controls run on two ranks")
    minimal = gate_runner.catch(
        "negative:ShardSumNormMuon (bf16 only)",
        norm_tie_cases(max_world=2),
        lambda case: gate_runner.run(_planted(case, ShardSumNormMuon)).message,
        lambda case: _planted(case, ShardSumNormMuon).describe(),
    )
    assert dict(minimal.settings)["ns_dtype"] == "bfloat16"
