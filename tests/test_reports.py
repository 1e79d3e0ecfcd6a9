"""Claims about the report: rendering is stable (golden text on a fixed-width, colourless
console), a killed run keeps every finished record, and a planted failing case shows up
in the terminal summary with a reproduce command that reproduces it."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from reports import read_stream, render, summarize, to_markdown

REPO = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden"

RECORDS = [
    {
        "kind": "header",
        "torch": "2.13.0",
        "backend": "gloo",
        "device": "cpu",
        "nproc": 2,
        "hypothesis_profile": "ci",
        "git_commit": "abc1234",
    },
    {
        "kind": "comparison",
        "gate": "one_step",
        "tier": "bitwise",
        "bitwise": True,
        "passed": True,
        "max_abs_diff": 0.0,
        "max_ulp": 0.0,
    },
    {
        "kind": "comparison",
        "gate": "one_step",
        "tier": "bitwise",
        "bitwise": True,
        "passed": True,
        "max_abs_diff": 0.0,
        "max_ulp": 0.0,
    },
    {
        "kind": "case",
        "gate": "one_step",
        "case": "Case(world=2)",
        "passed": True,
        "message": "",
        "seconds": 0.5,
        "reproduce": "",
    },
    {
        "kind": "comparison",
        "gate": "kernel",
        "tier": "ns-kernel",
        "bitwise": False,
        "passed": True,
        "max_abs_diff": 1e-3,
        "max_ulp": 3.0,
    },
    {
        "kind": "comparison",
        "gate": "kernel",
        "tier": "ns-kernel",
        "bitwise": False,
        "passed": False,
        "max_abs_diff": 0.25,
        "max_ulp": 1e6,
    },
    {
        "kind": "case",
        "gate": "kernel",
        "case": "Case(world=1, seed=7)",
        "passed": False,
        "message": "1 of 2 comparisons failed",
        "seconds": 1.25,
        "reproduce": "pytest 'gates/test_x.py::test_k' --nproc 2",
    },
    {
        "kind": "negative_control",
        "gate": "negative:LocalRowsMuon",
        "detected": True,
        "case": "Case(world=2, params=[w0[4, 4]])",
        "message": "w0 differs",
    },
    {
        "kind": "scenario",
        "gate": "moe:reproduce",
        "scenario": "rank 1 sends no tokens to expert 3",
        "wrapping": "per_expert",
        "variant": "naive",
        "env": {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
        "outcome": "collective mismatch",
        "detail": "rank 0: #7 _ALLGATHER_BASE [128]; rank 1: #7 _REDUCE_SCATTER_BASE [256]",
        "seconds": 0.4,
    },
    {"kind": "training", "gate": "training", "case": "dense", "train_bits": [8.0, 7.5], "held_out_bits": [8.1, 7.9]},
    {
        "kind": "training",
        "gate": "training",
        "case": "dense",
        "train_bits": [8.0, 7.5, 7.0],
        "held_out_bits": [8.1, 7.2],
    },
]


def _text(records: list[dict]) -> str:
    buffer = io.StringIO()
    Console(file=buffer, width=110, no_color=True, force_terminal=False, color_system=None).print(
        render(summarize(records))
    )
    return buffer.getvalue()


def test_terminal_summary_matches_golden_text() -> None:
    assert _text(RECORDS) == (GOLDEN / "summary.txt").read_text()


def test_markdown_summary_matches_golden_text_and_fits_a_job_summary() -> None:
    markdown = to_markdown(summarize(RECORDS))
    assert markdown == (GOLDEN / "summary.md").read_text()
    assert len(markdown.encode()) < 64 * 1024


def test_tolerance_pass_is_never_counted_as_bitwise() -> None:
    kernel = summarize(RECORDS).gates["kernel"]
    assert (kernel.bitwise, kernel.tolerance_passes, kernel.failed_cases) == (0, 1, 1)


def test_killed_run_keeps_every_finished_record(tmp_path: Path) -> None:
    report = tmp_path / "report"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", str(REPO / "gates"), "-m", "gate", "-k", "several_steps", "-q",
         "-p", "no:cacheprovider", "--rootdir", str(REPO), "--gate-report", str(report)],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    stream = report / "results.jsonl"
    deadline = time.monotonic() + 120
    cases = 0
    while time.monotonic() < deadline and cases < 20:
        time.sleep(0.5)
        cases = sum(r["kind"] == "case" for r in read_stream(stream)) if stream.exists() else 0
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    records = list(read_stream(stream))
    lines = stream.read_text().splitlines()
    assert cases >= 20 and records[0]["kind"] == "header"
    assert len(records) >= len(lines) - 1, "at most the line being written when killed is lost"
    assert sum(r["kind"] == "case" for r in records) >= 20


PLANTED = """
import pytest
from harness.cases import Case, ParamSpec

@pytest.mark.gate
def test_planted_bug_is_caught(gate_runner):
    case = Case(params=(ParamSpec("w", (6, 4)),), world_size=2, mesh=(2,), mode=None,
                candidate="gates.negative_controls:LocalRowsMuon")
    gate_runner.check("planted", case)
"""


def test_planted_failure_is_summarized_with_a_command_that_reproduces_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    pytester.makeconftest('pytest_plugins = ["harness.plugin"]')
    pytester.makepyfile(test_planted=PLANTED)
    first = pytester.runpytest_subprocess("-m", "gate", "--nproc", "2")
    first.assert_outcomes(failed=1)
    first.stdout.fnmatch_lines(
        [
            "*FAILED planted*",
            "*w step 0 rank*[bitwise]*",
            "reproduce: pytest 'test_planted.py::test_planted_bug_is_caught' --nproc 2",
        ]
    )
    again = pytester.runpytest_subprocess("test_planted.py::test_planted_bug_is_caught", "--nproc", "2")
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(["*FAILED planted*"])


def test_comparing_runs_names_new_failures_fixed_gates_and_grown_differences(tmp_path: Path) -> None:
    from reports.__main__ import main

    passing_kernel = next(r for r in RECORDS if r.get("gate") == "kernel" and r.get("passed"))
    base = [r for r in RECORDS if r.get("gate") != "kernel"]
    base.append(passing_kernel)
    base.append({"kind": "case", "gate": "kernel", "case": "c", "passed": True, "message": "", "seconds": 0.1})
    for name, records in (("base.jsonl", base), ("now.jsonl", RECORDS)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    from reports.compare import diff_runs

    diff = diff_runs(summarize(base), summarize(RECORDS))
    assert diff.new_failures == ["kernel"] and diff.grown == [("kernel", 1e-3, 0.25)] and diff.regressed
    assert not diff_runs(summarize(RECORDS), summarize(RECORDS)).regressed
    assert main(["compare", str(tmp_path / "base.jsonl"), str(tmp_path / "now.jsonl")]) == 1
    assert main(["compare", str(tmp_path / "now.jsonl"), str(tmp_path / "now.jsonl")]) == 0


def test_html_report_is_self_contained_with_pictures(tmp_path: Path) -> None:
    from reports import write_files

    records = [
        *RECORDS,
        {
            "kind": "spectrum",
            "gate": "oracle_spectrum",
            "shape": [4, 4],
            "dtype": "bfloat16",
            "singular_values": [1.1, 0.9, 0.8, 0.7],
            "band": [0.6, 1.25],
        },
    ]
    write_files(summarize(records), str(tmp_path), records)
    page = (tmp_path / "equivalence.html").read_text()
    assert page.count("<svg") == 4  # two gates' |diff| histograms, one spectrum, one loss curve
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org", "")
