"""Claim: pytest-xdist workers each run their own rank pool side by side, with no port or
store collisions, and the controller merges their streams into one report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from reports.records import CaseResult
from reports.stream import read_streams

REPO = Path(__file__).resolve().parents[1]


def test_two_xdist_workers_run_two_pools_and_one_report(tmp_path: Path) -> None:
    report = tmp_path / "report"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", str(REPO / "gates"), "-m", "gate", "-k", "edge or one_sharded",
         "-n", "2", "--nproc", "2", "-q", "-p", "no:cacheprovider", "--rootdir", str(REPO),
         "--gate-report", str(report)],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:]
    assert "muongate report:" in result.stdout and "results-gw0.jsonl, results-gw1.jsonl" in result.stdout
    records = read_streams(sorted(report.glob("results-gw*.jsonl")))
    cases = [r for r in records if isinstance(r, CaseResult)]
    assert len(cases) >= 200 and all(c.passed for c in cases)
    assert (report / "equivalence.html").exists() and (report / "equivalence.md").exists()
