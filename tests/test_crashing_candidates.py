"""Claims about candidates that hang, abort, raise, are slow, or keep state of another dtype,
end to end in a fresh pytest process: each failure is named for what it is (a hang with the
collective each rank waits in, a collective mismatch, an error at the candidate's own frame);
a slow rank is not a hang; a state tensor of another dtype is a finding with
figures, and no rank is respawned for it; a crash another gate already shrank is not shrunk
again. How long whole runs on such candidates take is measured by
``benchmarks/crashing_candidates.py``, not here."""

from __future__ import annotations

import pytest
from support import run_pytest

RAISING = """
from distributed_impl import ShardedMuon


class Raising(ShardedMuon):
    def step(self, closure=None):
        raise ValueError("planted: this candidate cannot step")


def raising(param_groups, **settings):
    return Raising(param_groups, **settings)
"""

GATES = """
from dataclasses import replace

import pytest
from hypothesis import given

from examples.aborting_muon import aborting_muon
from examples.bf16_state_muon import bf16_state_muon
from examples.deadlock_muon import deadlock_muon
from examples.slow_muon import slow_muon
import reference
from harness.algorithms import MUON
from harness.cases import Case, ParamSpec, cases
from raising import raising

pytestmark = pytest.mark.gate


def two(shape, candidate, dtype="float32", steps=1):
    params = (ParamSpec("w", shape, dtype), ParamSpec("v", (6, 4), dtype))
    return Case(params=params, world_size=2, mesh=(2,), steps=steps, candidate=candidate, reference=reference.Muon)


def test_bf16_state(gate_runner):
    gate_runner.check("bf16_state", two((8, 4), bf16_state_muon, "bfloat16", steps=2))


def test_no_rank_was_respawned_for_a_finding(gate_runner):
    assert gate_runner.pool.spawns == 1


def test_slow_but_correct(gate_runner):
    gate_runner.check("slow", two((8, 4), slow_muon))


ONE_MATRIX = cases(max_world=2, max_params=1, max_steps=1, adamw=False, experts=False, algorithm=MUON)


@given(case=ONE_MATRIX)
def test_first_gate_shrinks_the_hang(gate_runner, case):
    gate_runner.check("first", replace(case, candidate=deadlock_muon, world_size=2, mesh=(2,)))


@given(case=ONE_MATRIX)
def test_second_gate_does_not_shrink_it_again(gate_runner, case):
    gate_runner.check("second", replace(case, candidate=deadlock_muon, world_size=2, mesh=(2,)))


def test_deadlock(gate_runner):
    gate_runner.check("deadlock", two((1, 7), deadlock_muon))


def test_abort(gate_runner):
    gate_runner.check("abort", two((7, 5), aborting_muon))


def test_error(gate_runner):
    gate_runner.check("error", two((4, 4), raising))
"""


@pytest.mark.slow
def test_each_crash_is_named_for_what_it_is_and_a_slow_rank_is_not_a_hang(
    other_project: pytest.Pytester,
) -> None:
    other_project.makeconftest('pytest_plugins = ["harness.plugin"]')
    other_project.makepyfile(raising=RAISING, test_crashes=GATES)
    result = run_pytest(other_project, "test_crashes.py", "--nproc", "2", "-p", "no:randomly", timeout=300)
    result.assert_outcomes(passed=2, failed=6)
    result.stdout.fnmatch_lines_random(
        [
            "bf16_state: * comparisons with reference.Muon failed; worst first:",
            "*w.momentum_buffer step 0 rank ? [[]bitwise]*(dtype bfloat16, the reference's float32: compared after "
            "casting to float32)",
            "deadlock: hang: rank 0 waits in all_reduce, called from deadlock_muon.py:* in step*",
            "second: hang: *",
            "abort: collective mismatch: rank ? was killed (exit code -6, SIGABRT)*Received data size doesn't match*",
            "error: error on rank ?: ValueError: planted: this candidate cannot step at raising.py:* in step",
            "first: hang: *",
            "not shrunk again: gate first already showed the same hang on: w0[[]*",
        ]
    )
