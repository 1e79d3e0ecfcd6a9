"""Claims about ``--kernel`` and ``--gate-baseline``, end to end in fresh pytest processes."""

from __future__ import annotations

import json

import pytest
from support import run_pytest

SPECTRUM = "kernel_spectrum and 64x64"


@pytest.fixture
def project(other_project: pytest.Pytester) -> pytest.Pytester:
    """Another project: the harness installed (here: on the path), the gates run by package."""
    other_project.makeconftest('pytest_plugins = ["harness.plugin"]')
    return other_project


def _run(project: pytest.Pytester, *args: str) -> pytest.RunResult:
    # 20 cases a gate from a fixed seed: the claims are about the plug-in and the baseline, not how many
    return run_pytest(
        project, "--pyargs", "gates.test_kernel_gates", "-m", "gate", "-p", "no:randomly",
        "--hypothesis-profile", "dev", "--hypothesis-seed", "0", *args, timeout=900,
    )  # fmt: skip


def test_kernel_that_is_not_callable_is_a_usage_error_naming_it(project: pytest.Pytester) -> None:
    result = _run(project, "--kernel", "reference:MUON_DEFAULTS")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kernel reference:MUON_DEFAULTS*not callable*"])


@pytest.mark.slow
def test_broken_kernel_fails_its_gates_with_a_small_matrix(project: pytest.Pytester) -> None:
    result = _run(
        project,
        "--kernel",
        "examples.broken_kernel:row_norm_ns",
        "-k",
        "within_its_tier or (kernel_spectrum and 64x64 and float32)",
    )
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*relative Frobenius error*kernel_fp32*"])


@pytest.mark.slow
def test_baseline_regression_fails_the_session_and_says_what_moved(project: pytest.Pytester) -> None:
    first = _run(project, "-k", SPECTRUM)
    first.assert_outcomes(passed=2)
    figures = project.path / "gate-report" / "figures.json"
    data = json.loads(figures.read_text())
    assert set(data["gates"]) == {"kernel:oracle"}
    baseline = project.path / "baseline.json"
    baseline.write_text(json.dumps(data))
    assert _run(project, "-k", SPECTRUM, "--gate-baseline", str(baseline)).ret == pytest.ExitCode.OK
    oracle = data["gates"]["kernel:oracle"]
    oracle["sv_min"], oracle["sv_max"] = oracle["sv_min"] + 0.05, oracle["sv_max"] - 0.05  # a better past
    baseline.write_text(json.dumps(data))
    again = _run(project, "-k", SPECTRUM, "--gate-baseline", str(baseline))
    assert again.ret == pytest.ExitCode.TESTS_FAILED
    again.stdout.fnmatch_lines(["*REGRESSION against*kernel:oracle: singular values*margin 0.01*"])
