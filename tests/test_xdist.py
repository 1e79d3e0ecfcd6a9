"""Claim: pytest-xdist workers each run their own rank pool side by side, with no port or
store collisions, and the controller merges their streams into one report."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support import REPO, repo_env, run_python

from reports.records import CaseResult
from reports.stream import read_streams


def _gates(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """This checkout's gates with ``--nproc 2`` and ARGS, from ``tmp_path``, reporting to ``tmp_path/report``."""
    return run_python(
        "-m", "pytest", str(REPO / "gates"), "-m", "gate", *args, "--nproc", "2", "-q",
        "-p", "no:cacheprovider", "--rootdir", str(REPO), "--gate-report", str(tmp_path / "report"),
        cwd=tmp_path, env=repo_env(**env), timeout=600,
    )  # fmt: skip


@pytest.mark.slow
def test_two_xdist_workers_run_two_pools_and_one_report(tmp_path: Path) -> None:
    report = tmp_path / "report"
    result = _gates(tmp_path, "-k", "edge or one_step", "-n", "2", "--hypothesis-profile", "dev")
    assert result.returncode == 0, result.stdout[-4000:]
    assert "muongate report:" in result.stdout and "results-gw0.jsonl, results-gw1.jsonl" in result.stdout
    records = read_streams(sorted(report.glob("results-gw*.jsonl")))
    cases = [r for r in records if isinstance(r, CaseResult)]
    assert len(cases) >= 20 and all(c.passed for c in cases)
    assert (report / "equivalence.html").exists() and (report / "equivalence.md").exists()


@pytest.mark.slow
def test_a_gate_session_started_from_inside_an_xdist_worker_writes_its_own_report(tmp_path: Path) -> None:
    """A test of another project's xdist run that starts a gate session hands it the worker's
    ``PYTEST_XDIST_WORKER``: that session is no worker, and must stream and report on its own."""
    report = tmp_path / "report"
    result = _gates(tmp_path, "-k", "uneven-7x5", PYTEST_XDIST_WORKER="gw1", PYTEST_XDIST_WORKER_COUNT="2")
    assert result.returncode == 0, result.stdout[-4000:]
    assert "muongate report:" in result.stdout, result.stdout[-4000:]
    assert (report / "results.jsonl").exists() and not list(report.glob("results-gw*.jsonl"))
