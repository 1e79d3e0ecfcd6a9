"""Claims about the pytest plugin, checked end to end with ``pytester`` in fresh pytest
processes: options and markers exist, usage errors say how to fix them, a planted hang
ends the case instead of the run, and -x / --lf / -k behave as in any pytest suite."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

GATE_FILE = """
import pytest
from harness import selftest_tasks as tasks

pytestmark = pytest.mark.gate

def test_planted_hang_is_reported_and_the_run_goes_on(gate_runner):
    outcome = gate_runner.pool.run(tasks.hang_on_rank, 1, timeout_s=3)
    assert outcome.failure.kind == "hang"

def test_pool_works_after_the_hang(gate_runner):
    assert gate_runner.pool.run(tasks.sum_of_ranks).results == [1.0, 1.0]

def test_planted_failure(gate_runner):
    assert gate_runner.pool.run(tasks.sum_of_ranks).results == [0.0, 0.0]
"""


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    pytester.makeconftest('pytest_plugins = ["harness.plugin"]')
    pytester.makepyfile(test_gates=GATE_FILE)
    return pytester


def test_help_lists_the_muongate_options(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess("--help")
    result.stdout.fnmatch_lines(
        ["*muongate*", "*--nproc=NPROC*", "*--gate-device*", "*--case-timeout*", "*--gate-report=DIR*"]
    )


def test_nproc_zero_is_a_usage_error_that_says_what_to_do(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess("--nproc", "0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--nproc 0*at least one rank*try --nproc 2*"])


def test_cuda_without_enough_gpus_is_a_usage_error(suite: pytest.Pytester) -> None:
    import torch

    if torch.cuda.device_count() >= 64:
        pytest.skip("this machine has 64 GPUs")
    result = suite.runpytest_subprocess("--gate-device", "cuda", "--nproc", "64")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*needs one GPU per rank*--nproc 64*"])


def test_planted_hang_finishes_the_run_with_header_report_and_no_marker_warning(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess(
        "-m", "gate", "--nproc", "2", "-W", "error::pytest.PytestUnknownMarkWarning", "-p", "no:randomly"
    )
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["muongate: torch *, backend gloo on cpu, nproc 2, hypothesis * profile ci"])
    assert (suite.path / "gate-report" / "results.jsonl").exists()


def test_exitfirst_and_last_failed_rerun_only_what_failed(suite: pytest.Pytester) -> None:
    first = suite.runpytest_subprocess("-m", "gate", "-k", "planted_failure or works_after", "-x")
    first.assert_outcomes(passed=1, failed=1)
    again = suite.runpytest_subprocess("-m", "gate", "--lf")
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(["*run-last-failure*"])
