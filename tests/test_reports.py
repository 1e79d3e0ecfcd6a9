"""Claims about the report: rendering is stable (golden text on a fixed-width, colourless
console), a killed run keeps every finished record, and a planted failing case shows up
in the terminal summary with a reproduce command that reproduces it."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import signal
import subprocess
import sys
import time
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from support import REPO, open_in_chromium, repo_env, table_widths_in_chromium

from reports import ResultStream, SchemaError, read_stream, render, summarize, to_markdown
from reports.html import anchor
from reports.records import (
    CaseResult,
    Comparison,
    Header,
    NegativeControl,
    Record,
    Scenario,
    Skip,
    Spectrum,
    Training,
    decode,
    dumps,
)
from reports.summary import GATE_COLUMNS, gate_row

GOLDEN = Path(__file__).parent / "golden"

FAILING = Comparison(
    "output", (4, 4), tier="kernel_fp32", tier_kind="tolerance", bitwise=False, passed=False,
    max_abs_diff=0.25, max_ulp=1e6, mismatches=16, rel_fro=0.02,
)  # fmt: skip
WITHIN_TIER = Comparison(
    "output", (4, 4), tier="kernel_fp32", tier_kind="tolerance", bitwise=False, max_abs_diff=1e-3, max_ulp=3.0,
    mismatches=2, rel_fro=1e-5,
)  # fmt: skip
RECORDS: list[Record] = [
    Header(
        torch="2.13.0",
        backend="gloo",
        device="cpu",
        devices=("cpu", "cpu"),
        nproc=2,
        hypothesis_profile="ci",
        muongate="0.2.0",
        git_commit="abc1234",
        impl="distributed_impl:ShardedMuon",
    ),
    CaseResult(
        1,
        "world_size_independence",
        "w0[4, 4] float32 · world 2 · 1 step",
        seconds=0.5,
        comparisons=(
            Comparison("w0", (2, 4)),
            Comparison("w0", (2, 4), rank=1),
            Comparison("w0", (2, 4), against="self", bitwise=False, passed=False, max_abs_diff=0.5, max_ulp=9.0),
        ),
        judged="candidate",
        narrowed=("w0 bfloat16 → float32 (bf16 not declared)",),
    ),
    CaseResult(
        2,
        "edge:experts-4x31x13-fp32-ns",
        "w[4, 31, 13] float32 · world 2 · 2 steps · ns_dtype=float32",
        seconds=0.25,
        comparisons=(Comparison("w", (2, 31, 13)),),
        layout="3-D",
    ),
    CaseResult(
        3,
        "kernel:vs_reference",
        "gaussian [4, 4] float32 · kernel my:ns · seed 7",
        status="failed",
        message="1 of 2 comparisons failed",
        seconds=1.25,
        reproduce="pytest 'gates/test_x.py::test_k' --nproc 2",
        comparisons=(WITHIN_TIER, FAILING),
        judged="kernel",
    ),
    CaseResult(4, "kernel:edge", "nan [16, 24] bfloat16 · kernel my:ns", tier="edge", judged="kernel"),
    NegativeControl(
        "negative:LocalRowsMuon",
        True,
        "w0[4, 4] float32 · world 2 · 1 step · candidate gates.negative_controls:LocalRowsMuon",
        "w0 differs",
    ),
    Scenario(
        "moe:reproduce",
        "rank 1 sends no tokens to expert 3",
        "per_expert",
        "naive",
        "collective mismatch",
        detail="rank 0: #7 _ALLGATHER_BASE [128]; rank 1: #7 _REDUCE_SCATTER_BASE [256]",
        env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
        seconds=0.4,
    ),
    Training("training", "dense", 2, (8.0, 7.5), (8.1, 7.9)),
    Training("training", "dense", 2, (8.0, 7.5, 7.0), (8.1, 7.2)),
    Skip(
        "gates/test_optimizer_gates.py::test_hand_picked_edge_case_matches_reference_bitwise[hsdp-2x2-uneven]",
        "needs --nproc 4",
    ),
]
GATES = ("world_size_independence", "edge:experts-4x31x13-fp32-ns", "kernel:vs_reference", "kernel:edge")


def _text(records: list[Record], width: int = 140) -> str:
    buffer = io.StringIO()
    # crop=False: as the plug-in prints it, the reproduce command whole
    Console(file=buffer, width=width, no_color=True, force_terminal=False, color_system=None, emoji=False).print(
        render(summarize(records)), crop=False
    )
    return buffer.getvalue()


def test_terminal_summary_matches_golden_text_with_whole_gate_names_failing_first() -> None:
    text = _text(RECORDS)
    assert text == (GOLDEN / "summary.txt").read_text()
    assert all(gate in text for gate in GATES)
    assert text.index("kernel:vs_reference") < text.index("world_size_independence")


def test_markdown_summary_matches_golden_text_and_fits_a_job_summary() -> None:
    markdown = to_markdown(summarize(RECORDS))
    assert markdown == (GOLDEN / "summary.md").read_text()
    assert len(markdown.encode()) < 64 * 1024


def test_a_case_that_failed_before_comparing_counts_against_equal_to() -> None:
    equal = CaseResult(1, "g", "w[4, 4] · case 1", "passed", comparisons=(Comparison("w", (4, 4)),))
    errored = CaseResult(2, "g", "w[4, 4] · case 2", "error", message="rank 0: ValueError")
    hung = CaseResult(3, "g", "w[4, 4] · case 3", "hang", message="no rank can complete its collective")
    row = dict(zip(GATE_COLUMNS, gate_row(summarize([Header(), equal, errored, hung]).gates["g"]), strict=True))
    assert (row["failed"], row["equal to"]) == ("1 error, 1 hang", "ref 1/3")


def test_tolerance_pass_is_never_counted_as_bitwise() -> None:
    kernel = summarize(RECORDS).gates["kernel:vs_reference"]
    assert (kernel.bitwise, kernel.tolerance_passes, kernel.failed_cases) == (0, 1, 1)


def test_a_gate_that_judges_only_finiteness_shows_no_worst_difference() -> None:
    edge = summarize(RECORDS).gates["kernel:edge"]
    assert edge.worst_abs_diff is None
    assert "inf" not in next(line for line in _text(RECORDS).splitlines() if "kernel:edge" in line)


def test_every_record_kind_survives_its_json_round_trip() -> None:
    lines = [json.loads(dumps(r)) for r in RECORDS]
    assert list(decode(lines)) == RECORDS


def test_a_stream_stores_each_case_once_and_a_bitwise_comparison_in_a_few_bytes() -> None:
    line = dumps(
        CaseResult(9, "one_step", "w0[4, 4] float32 · world 2 · 1 step", comparisons=(Comparison("w0", (2, 4)),))
    )
    assert line.count("w0[4, 4]") == 1
    assert '"comparisons":{"rows":[["w0",[2,4]]],"at":[0]}' in line


#: Every field of a comparison away from its default somewhere, and pairs a careless
#: encoding would merge: -0.0 and 0.0, 1.0 and 1, an empty shard, NaN and infinity.
FIGURES = (
    Comparison("w0", (15, 23), dtype="bfloat16"),
    Comparison("w0", (15, 23), step=2, rank=1, dtype="bfloat16"),
    Comparison("w0.momentum_buffer", (0, 23), rank=1, note="empty shard"),
    Comparison("w1", (3, 3), step=1, all_zero=True, note="both all zero: compares nothing", against="self"),
    Comparison(
        "w1.update", (18, 18), step=1, rank=1, tier="gram_partial_bf16", tier_kind="tolerance", bitwise=False,
        max_abs_diff=0.015625, max_ulp=1982464000.0, mismatches=295, rel_fro=0.016685936602496582,
        worst_index=(14, 10), expected_at_worst=-0.0021820068359375, actual_at_worst=0.0023651123046875,
    ),
    Comparison(
        "w1.update", (18, 18), step=1, rank=1, tier="gram_partial_bf16", tier_kind="tolerance", bitwise=False,
        max_abs_diff=0.015625, max_ulp=1982464000.0, mismatches=295, rel_fro=0.016685936602496582,
        worst_index=(14, 10), expected_at_worst=-0.0021820068359375, actual_at_worst=-0.0,
    ),
    Comparison(
        "w1.update", (18, 18), step=1, rank=1, tier="gram_partial_bf16", tier_kind="tolerance", bitwise=False,
        max_abs_diff=0.015625, max_ulp=1982464000.0, mismatches=295, rel_fro=0.016685936602496582,
        worst_index=(14, 10), expected_at_worst=-0.0021820068359375, actual_at_worst=0.0,
    ),
    Comparison(
        "w2", (4, 4), step=3, dtype="float16", bitwise=False, passed=False, max_abs_diff=float("inf"),
        max_ulp=float("inf"), mismatches=1, rel_fro=float("nan"), worst_index=(0, 3), expected_at_worst=1.0,
        actual_at_worst=float("nan"), note="dtype float32, the reference's float16: compared after casting",
    ),
    Comparison("w2", (4, 4), max_ulp=1.0, mismatches=1, expected_at_worst=1.0, actual_at_worst=1, passed=False),
    Comparison("w3", (7,), step=12, rank=7, against="self", tier="kernel_fp32", tier_kind="tolerance"),
)  # fmt: skip


def test_every_comparison_field_has_its_place_in_a_row() -> None:
    fields = [f.name for f in dataclasses.fields(Comparison)]
    assert sorted([*Comparison.ROW, "step", "rank"]) == sorted(fields), "a new field goes at the end of ROW"


def test_a_stream_round_trips_every_comparison_figure_compactly(tmp_path: Path) -> None:
    case = CaseResult(5, "tier:gram_partial", "w1[36, 18] bfloat16 · world 2 · tp 2", comparisons=FIGURES)
    stream = ResultStream(tmp_path / "results.jsonl")
    for record in (Header(), case):
        stream.write(record)
    stream.close()
    back = list(read_stream(tmp_path / "results.jsonl"))[1]
    assert isinstance(back, CaseResult) and len(back.comparisons) == len(FIGURES)
    for wrote, read in zip(FIGURES, back.comparisons, strict=True):
        for f in dataclasses.fields(Comparison):
            a, b = getattr(wrote, f.name), getattr(read, f.name)
            # repr: NaN is not equal to itself, and -0.0 is equal to 0.0
            assert (type(a), repr(a)) == (type(b), repr(b)), f"{wrote.tensor} {f.name}: wrote {a!r}, read {b!r}"
    assert dumps(back) == dumps(case)
    # Compact: the comparisons that differ only in step and rank share a row; the rest are rows of their own.
    table = json.loads(dumps(case))["comparisons"]
    assert len(table["rows"]) == len(FIGURES) - 1 and table["at"][:2] == [0, [0, 2, 1]]


def test_a_bitwise_comparison_takes_at_most_16_bytes_of_its_case_line() -> None:
    """Schema 2 wrote each as an object of its own, about 50 bytes here; the main job's
    stream went over its 3 MB bound with it."""
    comparisons = tuple(
        Comparison(tensor, (15 - rank, 23), step=step, rank=rank)
        for rank in (0, 1)
        for step in range(3)
        for tensor in ("w0", "w0.momentum_buffer", "w1", "w1.momentum_buffer")
    )
    case = CaseResult(9, "several_steps", "w0[29, 23] float32, w1[29, 23] float32 · world 2 · 3 steps")
    compared = dataclasses.replace(case, comparisons=comparisons)
    each = (len(dumps(compared).encode()) - len(dumps(case).encode())) / len(comparisons)
    assert each <= 16, f"{each:.1f} bytes a bitwise comparison"
    one_more_step = (*comparisons, *(dataclasses.replace(c, step=3) for c in comparisons))
    more = len(dumps(dataclasses.replace(case, comparisons=one_more_step)).encode()) - len(dumps(compared).encode())
    assert more / len(comparisons) <= 8, "a comparison that repeats a row takes its index, step and rank"


def test_a_schema_1_stream_is_read_and_a_newer_one_refused_by_name(tmp_path: Path) -> None:
    v1 = [
        {"kind": "header", "torch": "2.13.0", "backend": "gloo", "nproc": 2, "git_commit": "abc"},
        {"kind": "comparison", "gate": "one_step", "tensor": "w0", "step": 0, "rank": 0, "tier": "bitwise",
         "tier_kind": "bitwise", "shape": [2, 4], "dtype": "float32", "numel": 8, "bitwise": True, "passed": True,
         "max_abs_diff": 0.0, "max_ulp": 0.0, "mismatches": 0, "mismatch_fraction": 0.0, "worst_index": None,
         "expected_at_worst": None, "actual_at_worst": None, "all_zero": False, "note": "", "rel_fro": 0.0,
         "case": "Case(world=2)", "case_seconds": 0.1},
        {"kind": "case", "gate": "one_step", "case": "Case(world=2)", "passed": True, "message": "", "seconds": 0.1},
        {"kind": "case", "gate": "one_step", "case": "Case(world=1)", "passed": False, "seconds": 0.1,
         "message": "rank 1 hang: ranks [1] did not finish before the deadline", "reproduce": "pytest x"},
    ]  # fmt: skip
    (tmp_path / "v1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in v1))
    records = list(read_stream(tmp_path / "v1.jsonl"))
    one_step = summarize(records).gates["one_step"]
    assert (one_step.cases, one_step.failed_cases, one_step.comparisons, one_step.bitwise) == (2, 1, 1, 1)
    assert [r.status for r in records if isinstance(r, CaseResult)] == ["passed", "hang"]
    (tmp_path / "v9.jsonl").write_text(json.dumps({"kind": "header", "schema": 9}) + "\n")
    with pytest.raises(SchemaError, match="schema 9, written by another muongate"):
        list(read_stream(tmp_path / "v9.jsonl"))


#: A schema 2 stream as muongate wrote it before comparisons went into tables (lines of a CI run).
V2 = [
    {"kind": "header", "schema": 2, "muongate": "0.1.0", "git_commit": "e63c5fd", "torch": "2.13.0",
     "backend": "gloo", "device": "cpu", "devices": ["cpu", "cpu"], "nproc": 2, "hypothesis_profile": "ci"},
    {"kind": "case", "id": 1, "gate": "several_steps", "case": "w0[4, 9, 17] bfloat16 · world 2 · 2 steps",
     "seconds": 0.1186, "comparisons": [
         {"tensor": "w0", "shape": [2, 9, 17], "dtype": "bfloat16"},
         {"tensor": "w0.momentum_buffer", "shape": [2, 9, 17], "step": 1},
         {"tensor": "w0", "shape": [0, 9, 17], "rank": 1, "dtype": "bfloat16", "note": "empty shard"}],
     "judged": "candidate", "layout": "3-D"},
    {"kind": "case", "id": 2, "gate": "tier:gram_partial", "case": "w0[18, 18] float32 rowwise · world 2 · tp 2",
     "seconds": 0.0266, "comparisons": [
         {"tensor": "w0.update", "shape": [18, 18], "tier": "gram_partial_bf16", "tier_kind": "tolerance",
          "bitwise": False, "max_abs_diff": 0.015625, "max_ulp": 1982464000.0, "mismatches": 295,
          "rel_fro": 0.016685936602496582, "worst_index": [14, 10], "expected_at_worst": -0.0021820068359375,
          "actual_at_worst": 0.0023651123046875}],
     "judged": "gram_partial_muon", "layout": "tp"},
]  # fmt: skip


def test_a_schema_2_stream_reads_as_written_and_compares_with_its_schema_3_rewrite(tmp_path: Path) -> None:
    from reports.__main__ import main

    (tmp_path / "v2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in V2))
    records = list(read_stream(tmp_path / "v2.jsonl"))
    assert isinstance(records[0], Header) and records[0].schema == 2
    cases = [r for r in records if isinstance(r, CaseResult)]
    assert [c.fields_json() for c in cases[0].comparisons] == V2[1]["comparisons"]
    worst = cases[1].comparisons[0]
    assert (worst.worst_index, worst.actual_at_worst, worst.max_ulp) == ((14, 10), 0.0023651123046875, 1982464000.0)
    (tmp_path / "v3.jsonl").write_text("".join(dumps(r) + "\n" for r in [Header(), *records[1:]]))
    assert list(read_stream(tmp_path / "v3.jsonl"))[1:] == records[1:]
    assert (tmp_path / "v3.jsonl").stat().st_size < (tmp_path / "v2.jsonl").stat().st_size
    assert main(["compare", str(tmp_path / "v2.jsonl"), str(tmp_path / "v3.jsonl")]) == 0
    assert main(["compare", str(tmp_path / "v3.jsonl"), str(tmp_path / "v2.jsonl")]) == 0


@pytest.mark.slow
def test_killed_run_keeps_every_finished_record(tmp_path: Path) -> None:
    report = tmp_path / "report"
    env = repo_env()
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
        cases = sum(isinstance(r, CaseResult) for r in read_stream(stream)) if stream.exists() else 0
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    records = list(read_stream(stream))
    lines = stream.read_text().splitlines()
    assert cases >= 20 and isinstance(records[0], Header)
    assert len(records) >= len(lines) - 1, "at most the line being written when killed is lost"
    assert sum(isinstance(r, CaseResult) for r in records) >= 20


PLANTED = """
import pytest
import reference
from gates.negative_controls import LocalRowsMuon
from harness.cases import Case, ParamSpec

@pytest.mark.gate
def test_planted_bug_is_caught(gate_runner):
    case = Case(params=(ParamSpec("w", (6, 4)),), world_size=2, mesh=(2,), mode=None, candidate=LocalRowsMuon, reference=reference.Muon)
    gate_runner.check("planted", case)
"""


@pytest.mark.slow
def test_planted_failure_is_summarized_with_a_command_that_reproduces_it(
    other_project: pytest.Pytester, rerun_reproduce: Any
) -> None:
    other_project.makeconftest('pytest_plugins = ["harness.plugin"]')
    other_project.makepyfile(test_planted=PLANTED)
    first = other_project.runpytest_subprocess("-m", "gate", "--nproc", "2")
    first.assert_outcomes(failed=1)
    first.stdout.fnmatch_lines(
        [
            "*FAILED planted*",
            "minimal case: w[6, 4] float32 · world 2 · 1 step · candidate gates.negative_controls:LocalRowsMuon",
            "*w step 0 rank*[bitwise]*",
            "reproduce: PYTHONPATH=* python -m pytest -p harness.plugin */test_planted.py::test_planted_bug_is_caught "
            "--nproc 2",
        ]
    )
    # The failure reads as its verdict, not as a traceback through the harness.
    assert "def check(" not in first.stdout.str() and "harness/runner.py" not in first.stdout.str()
    again = rerun_reproduce(first.stdout.str())
    assert again.returncode == 1, again.stdout[-3000:]
    assert "minimal case: w[6, 4] float32 · world 2 · 1 step" in again.stdout, again.stdout[-3000:]


def test_comparing_runs_names_new_failures_fixed_gates_and_grown_differences(tmp_path: Path) -> None:
    from reports.__main__ import main
    from reports.diff import diff_runs

    passing = CaseResult(3, "kernel:vs_reference", "c", seconds=0.1, comparisons=(WITHIN_TIER,))
    base = [r for r in RECORDS if getattr(r, "gate", "") != "kernel:vs_reference"] + [passing]
    for name, records in (("base.jsonl", base), ("now.jsonl", RECORDS)):
        (tmp_path / name).write_text("".join(dumps(r) + "\n" for r in records))
    diff = diff_runs(summarize(base), summarize(RECORDS))
    assert diff.new_failures == ["kernel:vs_reference"] and diff.grown == [("kernel:vs_reference", 1e-3, 0.25)]
    assert diff.regressed and diff.recounted == [("kernel:vs_reference", 1, 1)]
    assert not diff_runs(summarize(RECORDS), summarize(RECORDS)).regressed
    assert main(["compare", str(tmp_path / "base.jsonl"), str(tmp_path / "now.jsonl")]) == 1
    assert main(["compare", str(tmp_path / "now.jsonl"), str(tmp_path / "now.jsonl")]) == 0


def _page(tmp_path: Path) -> str:
    from reports import write_files

    spectrum = Spectrum("oracle_spectrum", (4, 4), "bfloat16", (1.1, 0.9, 0.8, 0.7), (0.6, 1.25))
    write_files(summarize([*RECORDS, spectrum]), tmp_path)
    return (tmp_path / "equivalence.html").read_text()


def test_html_report_is_a_self_contained_page_with_a_section_per_gate_and_its_pictures(tmp_path: Path) -> None:
    page = _page(tmp_path)
    # one chart of every gate's comparisons, the failing gate's own, its piece map and its max|diff|
    # by step and tensor, one spectrum, one loss curve
    assert page.count("<svg") == 6
    assert page.count('aria-label="max|diff| of ') == 2 and 'aria-label="max|diff| of all gates"' in page
    assert "max|diff| by step (columns) and tensor (rows)" in page
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org", "")
    for gate in GATES:
        assert f'<section id="{anchor(gate)}"><h3>{gate}</h3>' in page and f'href="#{anchor(gate)}"' in page


def _outcomes() -> list[Record]:
    """A gate of each outcome: bitwise, in tier, within causes, not judged, differs, hangs."""
    header = Header(nproc=2, impl="their_muon:muon")
    differs = Comparison("w", (2, 4), bitwise=False, passed=False, max_abs_diff=0.5, max_ulp=9.0, mismatches=8)
    return [
        header,
        CaseResult(1, "one_step", "w[4, 4] · world 2", comparisons=(Comparison("w", (2, 4)),), judged="candidate"),
        CaseResult(2, "training", "dense", comparisons=(WITHIN_TIER,), judged="candidate"),
        CaseResult(
            3, "several_steps", "w[4, 4] · world 2", "within causes", figures={"cause_reach": 0.74},
            comparisons=(differs,), judged="candidate",
        ),
        CaseResult(4, "edge:bf16-33x17", "w[33, 17] bfloat16", "not judged", comparisons=(differs,), judged="candidate"),
        CaseResult(5, "checkpoint", "w[4, 4] · world 2", "failed", "1 of 1 comparisons failed", comparisons=(differs,)),
        CaseResult(6, "robust:empty-local-shards", "w[1, 4] · world 2", "hang", "no rank can complete"),
    ]  # fmt: skip


def test_the_top_line_counts_gates_by_outcome_and_each_gate_has_its_outcomes_colour() -> None:
    from reports.html import page

    summary = summarize(_outcomes())
    line = "6 gates: 1 bitwise, 1 in tier, 1 within causes, 1 not judged, 1 differ, 1 hang"
    html = page(summary)
    assert '<p class="outcomes">' in html and line in re.sub(r"<[^>]+>", "", html)
    assert f"**{line}**" in to_markdown(summary) and line in _text(_outcomes())
    badges = dict(
        re.findall(r'<a class="\w+" href="#gate-([^"]+)">[^<]*</a></th><td><span class="badge ([\w-]+)">', html)
    )
    assert badges == {
        "one_step": "o-bitwise", "training": "o-tier", "several_steps": "o-causes", "edge_bf16-33x17": "o-unjudged",
        "checkpoint": "o-fail", "robust_empty-local-shards": "o-fail",
    }  # fmt: skip
    assert '>within causes</span><br><span class="note">≤ 0.74 of the tier</span>' in html
    # a gate whose every case was not judged is not "passed"
    section = html.split("edge:bf16-33x17</h3>")[1].split("</section>")[0]
    assert "none of 1 cases judged</span>" in section and "passed" not in section


def test_cases_within_causes_at_none_of_their_tier_read_equal_in_value_in_every_report() -> None:
    """A reach of 0 (each difference a zero's sign) read "(≤ 0 of the tier)"."""
    from reports.html import page

    differs = Comparison("w", (2, 4), bitwise=False, passed=False, max_abs_diff=0.0, mismatches=1)
    records = [
        Header(nproc=2, impl="their_muon:muon"),
        CaseResult(1, "one_step", "w[4, 4] · world 2", "within causes", figures={"cause_reach": 0.0},
                   comparisons=(differs,), judged="candidate"),
    ]  # fmt: skip
    summary = summarize(records)
    html, markdown, text = page(summary), to_markdown(summary), _text(records)
    assert "1 within causes (equal in value)" in markdown and "1 within causes (equal in value)" in text
    assert '>within causes</span><br><span class="note">equal in value</span>' in html
    assert 'causes<span class="note">, equal in value</span>' in html.split('<section id="gate-one_step">')[1]
    assert "≤ 0 of" not in html + markdown + text


def test_a_named_candidate_that_judged_nothing_says_why_above_the_gate_table() -> None:
    from reports.html import page

    records = [
        Header(impl="their_muon:half"),
        CaseResult(1, "one_step", "w[4, 4]", "not judged", judged="candidate"),
        *(Skip(f"g{i}", f"g{i}: not run: their_muon:half does not declare bf16") for i in range(3)),
    ]
    summary = summarize(records)
    html, markdown = page(summary), to_markdown(summary)
    why = "NOT JUDGED: nothing of the candidate was judged: 1 case(s) not judged (a difference no tier could judge, or routes no state showed)"
    assert html.index(f'<p class="unjudged">{why}') < html.index("<h2>Gates</h2>")
    assert markdown.index(f"> **{why.replace(':', ':**', 1)}") < markdown.index("| gate |")
    # muongate's own candidate is no candidate the user named: no such line
    default = summarize([dataclasses.replace(records[0], impl="distributed_impl:ShardedMuon"), *records[1:]])
    assert "NOT JUDGED" not in page(default) and "NOT JUDGED" not in to_markdown(default)


def test_a_run_where_no_gate_ran_says_so_and_draws_no_empty_gate_table() -> None:
    from reports.html import page

    summary = summarize([Header(), Skip("checkpoint", "needs --nproc 4")])
    html, markdown = page(summary), to_markdown(summary)
    assert '<p class="outcomes">no gate ran a case</p>' in html and "<table>" not in html
    assert "**no gate ran a case**" in markdown and "| gate |" not in markdown


def test_the_first_failure_sits_right_under_the_gate_table_in_html_and_markdown() -> None:
    from reports.html import page

    summary = summarize(RECORDS)
    html = page(summary)
    table_end = html.index("</table>")
    assert table_end < html.index('FAILED <a href="#gate-kernel_vs_reference">') < html.index("<h2>Negative controls")
    minimal = html.index("<p><code>gaussian [4, 4] float32 · kernel my:ns · seed 7</code></p>")
    assert minimal < html.index("<h2>", table_end)
    markdown = to_markdown(summary)
    last_row = markdown.index("| world_size_independence |")
    failed = markdown.index("**FAILED** `kernel:vs_reference`: differs from reference (1 failing case(s)")
    assert last_row < failed < markdown.index("_judged: whose code")


def test_skips_are_a_count_per_reason_naming_their_tests() -> None:
    """The HTML folds each reason's gate tests under its count; the Markdown names their test
    functions, each once; a reason one skip has reads as written, naming its gate."""
    from reports.html import page

    reason = "their_muon:m does not declare checkpoint"
    skips = [Skip(g, f"{g}: not run: {reason}") for g in ("checkpoint", "hybrid_groups", "world_size_independence")]
    kernel = [Skip(f"gates/test_kernel_gates.py::test_kernel_edge[{p}]", "judges a kernel") for p in ("nan", "zero")]
    narrowed = Skip("edge:experts-3x6x4", "edge:experts-3x6x4: not run: narrowed for x: w [3, 6, 4] → one expert")
    summary = summarize([*RECORDS, *skips, *kernel, narrowed])
    html, markdown = page(summary), to_markdown(summary)
    listed = "".join(f"<li><code>{g}</code></li>" for g in ("checkpoint", "hybrid_groups", "world_size_independence"))
    assert f'<summary class="skip">3 gate test(s): not run: {reason}</summary><ul>{listed}</ul>' in html
    assert '<summary class="skip">1 gate test(s): needs --nproc 4</summary>' in html
    assert "<h2>Skipped: 7 gate test(s)</h2>" in html and "## Skipped: 7 gate test(s)" in markdown
    assert (
        f"- 3 gate test(s): not run: {reason} (`checkpoint`, `hybrid_groups`, `world_size_independence`)\n"
        "- 2 gate test(s): judges a kernel (`test_kernel_edge` ×2)\n"
    ) in markdown
    assert (
        "- 1 gate test(s): edge:experts-3x6x4: not run: narrowed for x: w [3, 6, 4] → one expert (`edge:experts-3x6x4`)"
        in markdown
    )
    assert (
        "- 1 gate test(s): needs --nproc 4 (`test_hand_picked_edge_case_matches_reference_bitwise[hsdp-2x2-uneven]`)"
        in markdown
    )


def test_a_passing_report_draws_one_chart_of_every_comparison_not_one_per_gate() -> None:
    from reports.html import page

    passing = [r for r in RECORDS if not (isinstance(r, CaseResult) and r.failed)]
    html = page(summarize(passing))
    assert html.count('aria-label="max|diff| of ') == 1
    assert "all 3 gates: 4 comparisons by max|diff|" in html


#: a 7×5 weight over two ranks (FSDP2 rows 0–3 and 4–6), wrong only on rank 1, worst at its row 2
SHARDED = CaseResult(
    7, "edge:uneven-7x5", "w[7, 5] float32 · world 2 · 1 step", "failed", "w differs on rank 1",
    comparisons=(
        Comparison("w", (4, 5)),
        Comparison("w", (3, 5), rank=1, bitwise=False, passed=False, max_abs_diff=0.125, max_ulp=3e5, mismatches=6,
                   worst_index=(2, 1), expected_at_worst=1.0, actual_at_worst=1.125),
    ),
)  # fmt: skip


def test_a_failing_tensor_gets_a_map_of_its_ranks_pieces_with_the_worst_element_marked() -> None:
    from reports.html import page

    html = unescape(page(summarize([Header(nproc=2), SHARDED])))
    assert "w step 0: 7 × 5 (rows down, columns across)" in html
    assert ">rank 0 · rows 0–3 · passed</text>" in html
    assert ">rank 1 · rows 4–6 · 6/15 differ, max|diff| 0.125</text>" in html
    assert "differs at step 0: its ranks' pieces as bands of its rows, as FSDP2's Shard(0) lays them out." in html
    assert "rank r from row r·⌈n/w⌉" in html  # how to read it, once
    # the worst element, rank 1's [2, 1], is the whole tensor's row 6, column 1: at its cell's centre
    left, top, cell = 34, 24, 24
    centre = (left + 1.5 * cell, top + 6.5 * cell)
    assert re.search(rf'<path d="M{centre[0] - 8.4:.1f},{centre[1] - 8.4:.1f}L', html), "no × at w[6, 1]"
    assert "<title>rank 1 worst at [2, 1]: expected 1.0 got 1.125</title>" in html


def test_pieces_that_do_not_stack_into_the_named_tensor_are_drawn_each_on_its_own() -> None:
    from reports.html import page

    columns = dataclasses.replace(
        SHARDED,
        case="w[4, 10] float32 · world 2 · tp 2",
        comparisons=tuple(dataclasses.replace(c, shape=(4, 5)) for c in SHARDED.comparisons),
    )
    html = unescape(page(summarize([Header(nproc=2), columns])))
    assert "w step 0: each rank's piece" in html and ">rank 1: 6/20 differ, max|diff| 0.125</text>" in html
    assert "each rank's piece on its own: where it sits in the whole tensor is not recorded" in html


def test_terminal_summary_fits_100_columns_with_every_word_whole() -> None:
    """Every line but the reproduce command (one line, to be copied) fits 100 columns, and no word
    is cut: each word at 100 columns is a word of the same summary at 1000, where nothing wraps."""
    records = [*RECORDS, *_outcomes()[1:], SHARDED]
    narrow, wide = _text(records, 100), _text(records, 1000)
    for line in narrow.splitlines():
        assert len(line) <= 100 or line.startswith("reproduce: "), line
    words = set(wide.split())
    cut = {w for w in narrow.split() if w not in words and set(w) != {"─"}}  # a table's rule is as wide as it
    assert not cut, sorted(cut)
    for gate in (*GATES, "robust:empty-local-shards", "edge:uneven-7x5"):
        assert re.search(rf"(^|\s){re.escape(gate)}(\s|$)", narrow), gate


def _wide_gate_table() -> list[Record]:
    """A run whose gate table is as wide as a candidate's run makes it: long gate names, narrowed
    cases, failures of several kinds, cases within causes, comparisons in a tier."""
    ok, tier = Comparison("w0", (4, 4)), dataclasses.replace(WITHIN_TIER, tier="gram_partial_fp32")
    differs = Comparison("w0", (4, 4), bitwise=False, passed=False, max_abs_diff=1.2345e-4, max_ulp=123456.0)
    records: list[Record] = [Header(nproc=2, impl="examples.pytorch_optimizer_adapter:distributed_muon")]
    gates = ("one_step", "several_steps", "world_size_independence", "edge:experts-4x31x13-fp32-ns",
             "edge:rank-asymmetric-missing-grads", "robust:rank-asymmetric-missing-grad", "tier:causes",
             "orthogonalize_gathered")  # fmt: skip
    for g in gates:
        for n in range(3):
            i = len(records)
            if g == "tier:causes":
                records.append(CaseResult(i, g, "w0[4, 4]", "within causes", figures={"cause_reach": 0.74},
                                          comparisons=(differs,) * 40 + (ok,) * 400, judged="candidate",
                                          narrowed=("w0 bfloat16 → float32",), seconds=1.3))  # fmt: skip
            elif g.startswith("robust"):
                records.append(CaseResult(i, g, "w0[1, 4]", ("hang", "abort", "collective mismatch")[n], "stuck",
                                          judged="candidate", seconds=60.0))  # fmt: skip
            else:
                records.append(CaseResult(i, g, "w0[4, 4]", comparisons=(ok,) * 400 + (tier,) * 120,
                                          judged="muongate: exchange" if g.startswith("ortho") else "candidate",
                                          narrowed=("x",) * (n % 2), seconds=1234.5))  # fmt: skip
    return records


@pytest.mark.parametrize("window", [1920, 1280])
def test_the_gate_table_fits_the_window_every_column_in_view(tmp_path: Path, window: int) -> None:
    """Its max|diff|, max ULP and seconds were behind a horizontal scroll at 1920 px: the page was
    80em wide and kept every count and name on one line. Tables now take the window (the prose
    keeps its measure) and wrap their cells, a count with its word."""
    from reports import write_files

    write_files(summarize(_wide_gate_table()), tmp_path)
    content, box = table_widths_in_chromium(tmp_path / "equivalence.html", tmp_path / "profile", window)
    assert content <= box, f"the gate table takes {content} px of its {box} px at a {window} px window"


def test_html_report_renders_in_headless_chromium_with_every_gate_name_whole(tmp_path: Path) -> None:
    from reports import write_files

    write_files(summarize([*RECORDS, SHARDED]), tmp_path)
    texts, shot = open_in_chromium(tmp_path / "equivalence.html", tmp_path / "profile")
    for gate in GATES:
        assert gate in texts, f"{gate!r} is not the whole text of any element of the rendered page"
    assert "muongate equivalence report" in texts
    assert "5 gates:" in texts and "2 bitwise" in texts and "1 in tier" in texts and "2 differ" in texts, texts[:40]
    assert "rank 1 · rows 4–6 · 6/15 differ, max|diff| 0.125" in texts
    assert "max|diff| by step (columns) and tensor (rows), worst over ranks" in texts
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 20_000, "the page rendered blank"
