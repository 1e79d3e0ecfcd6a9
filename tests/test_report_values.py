"""Claims about the report whatever the values it holds (issue #50, item 2: nothing finished
is lost): every writer renders any record the stream can hold, NaN, infinities and -0.0 in
any figure, empty tensors, cases that compared nothing, gates without cases, and names and
messages with markup, HTML and any unicode in them; ``figures.json`` stays strict JSON that
reads back every figure; a report file is never left empty or half written."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import re
import tempfile
from pathlib import Path
from typing import Any, get_args

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

import reports.files
import reports.html
import reports.markdown
from reports import render, to_markdown, write_files
from reports.__main__ import main
from reports.diff import diff_runs, render_diff
from reports.files import figures, from_figures
from reports.html import page
from reports.records import (
    BEYOND_CAUSES,
    CaseResult,
    Comparison,
    Header,
    NegativeControl,
    Record,
    Routing,
    Scenario,
    Skip,
    Spectrum,
    Status,
    TierKind,
    Training,
    Unjudged,
    dumps,
)
from reports.stream import ResultStream, read_stream
from reports.summary import LAYOUT_ORDER, GateSummary, RunSummary, encodable, summarize

#: strings a careless writer trips on: console markup, emoji codes, HTML, Markdown's table
#: and code syntax, line breaks, a lone surrogate (a subprocess's output decoded with
#: surrogateescape), scripts of other languages
AWKWARD = (
    "",
    "[/]",
    "[bold red]x",
    ":smile:",
    "<script>alert('&amp;')</script>",
    "\"quoted\" & 'single'",
    "a | b",
    "```",
    "`tick`",
    "line\nbreak\r\n",
    "tab\there",
    "\udcff",
    "ü→✓ 中文 🙂",
    "\x1b[31mred",
    "nan",
)
texts = st.one_of(st.sampled_from(AWKWARD), st.text(max_size=8))
#: few names, so drawn comparisons share tensors and steps and drawn cases share gates
names = st.one_of(st.sampled_from(("w0", "w1", "g", "kernel:edge")), texts)
figure = st.one_of(
    st.sampled_from((math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324, 1.7976931348623157e308, -1.0)),
    st.floats(allow_nan=True, allow_infinity=True),
)
shape = st.lists(st.integers(0, 5), max_size=3).map(tuple)

comparisons = st.builds(
    Comparison,
    tensor=names,
    shape=shape,
    step=st.integers(0, 3),
    rank=st.integers(0, 2),
    dtype=st.sampled_from(("float32", "bfloat16")) | texts,
    tier=st.sampled_from(("bitwise", "kernel_fp32")) | texts,
    tier_kind=st.sampled_from(get_args(TierKind)),
    bitwise=st.booleans(),
    passed=st.booleans(),
    max_abs_diff=figure,
    max_ulp=figure,
    mismatches=st.integers(0, 30),
    rel_fro=figure,
    worst_index=st.none() | shape,
    expected_at_worst=st.none() | figure,
    actual_at_worst=st.none() | figure,
    all_zero=st.booleans(),
    note=texts,
    against=st.sampled_from(("reference", "self")) | texts,
    diff_norm=figure,
    change_norm=figure,
)
cases = st.builds(
    CaseResult,
    id=st.integers(0, 10),
    gate=names,
    case=texts,
    status=st.sampled_from(get_args(Status)),
    message=texts,
    seconds=figure,
    reproduce=texts,
    tier=texts,
    figures=st.dictionaries(
        st.sampled_from(("sv_min", "sv_max", "orthogonality_error", BEYOND_CAUSES)) | texts, figure
    ),
    comparisons=st.lists(comparisons, max_size=6).map(tuple),
    judged=texts,
    narrowed=st.lists(texts, max_size=2).map(tuple),
    layout=st.sampled_from(LAYOUT_ORDER) | texts,
)
headers = st.builds(
    Header,
    muongate=texts,
    git_commit=texts,
    torch=texts,
    backend=texts,
    device=texts,
    devices=st.lists(texts, max_size=2).map(tuple),
    nproc=st.integers(0, 8),
    hypothesis_profile=texts,
    hypothesis_seed=st.none() | texts,
    impl=texts,
    kernel=st.none() | texts,
    against=st.sampled_from(("reference", "self")) | texts,
    time=texts,
    probed=st.lists(texts, max_size=2).map(tuple),
    engine=texts,
    cpu=texts,
)
others = st.one_of(
    st.builds(Unjudged, part=texts, reason=texts, asked=st.booleans()),
    st.builds(Skip, gate=names, reason=texts),
    st.builds(
        Scenario,
        gate=names,
        scenario=texts,
        wrapping=texts,
        variant=texts,
        outcome=st.sampled_from(("completed", "error")) | texts,
        case=texts,
        detail=texts,
        no_tokens=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=2).map(tuple),
        env=st.dictionaries(texts, texts, max_size=2),
        collectives=st.lists(st.dictionaries(texts, st.integers() | texts | figure, max_size=2), max_size=2).map(tuple),
        seconds=figure,
    ),
    st.builds(
        Training,
        gate=names,
        case=texts,
        world_size=st.integers(0, 4),
        train_bits=st.lists(figure, max_size=5).map(tuple),
        held_out_bits=st.lists(st.none() | figure, max_size=3).map(tuple),
        seconds=figure,
    ),
    st.builds(
        Spectrum,
        gate=names,
        shape=shape,
        dtype=texts,
        singular_values=st.lists(figure, max_size=6).map(tuple),
        band=st.tuples(figure, figure),
    ),
    st.builds(NegativeControl, gate=names, detected=st.booleans(), case=texts, message=texts),
    st.builds(
        Routing,
        gate=names,
        case=texts,
        judged=texts,
        rows=st.lists(
            st.tuples(texts, texts, texts, st.sampled_from(["ok", "wrong", "not shown"]) | texts), max_size=3
        ).map(tuple),
    ),
)
runs = st.builds(lambda h, rest: [h, *rest], headers, st.lists(cases | others, max_size=8))

#: an SVG attribute that places or sizes something: a NaN or an infinity there draws nothing
_GEOMETRY = re.compile(r'\s(?:x|y|x1|x2|y1|y2|cx|cy|r|width|height|points)="([^"]*)"')


def _refuse(word: str) -> Any:
    raise ValueError(f"{word} is not JSON")


def _strict_json(text: str) -> Any:
    return json.loads(text, parse_constant=_refuse)


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN to NaN included, and of the same sign (``-0.0`` is not ``0.0``)."""
    return (type(a), repr(a)) == (type(b), repr(b))


def _terminal(summary: RunSummary) -> str:
    buffer = io.StringIO()
    Console(file=buffer, width=100).print(render(summary))
    buffer.getvalue().encode("utf-8")  # a terminal takes it: no lone surrogate
    return buffer.getvalue()


def _check_page(text: str, summary: RunSummary) -> None:
    assert text.startswith("<!DOCTYPE html>") and text.endswith("</html>")
    text.encode("utf-8")  # a browser takes it: no lone surrogate
    for value in _GEOMETRY.findall(text):
        assert not re.search(r"nan|inf", value, re.IGNORECASE), f"an SVG coordinate that draws nothing: {value!r}"
    for gate in summary.gates:
        assert f"<h3>{encodable(reports.html._e(gate))}</h3>" in text
    for f in summary.failures:
        assert f"<p><code>{encodable(reports.html._e(f.case))}</code></p>" in text


def _check_figures(directory: Path, summary: RunSummary) -> RunSummary:
    """``figures.json`` is strict JSON and reads back every gate's every figure."""
    back = from_figures(_strict_json((directory / "figures.json").read_text(encoding="utf-8")))
    assert set(back.gates) == set(summary.gates)
    for name, g in summary.gates.items():
        for f in dataclasses.fields(GateSummary):
            wrote, read = getattr(g, f.name), getattr(back.gates[name], f.name)
            assert _same(read, wrote) if isinstance(wrote, float) else read == wrote, f"{name} {f.name}"
    return back


@given(records=runs)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_writer_renders_any_drawn_record(records: list[Record]) -> None:
    summary = summarize(records)
    _terminal(summary)
    _check_page(page(summary), summary)
    markdown = to_markdown(summary)
    markdown.encode("utf-8")  # a job summary takes it: no lone surrogate
    for gate in summary.gates:
        assert encodable(reports.markdown._cell(gate)) in markdown
    for f in summary.failures:
        assert encodable(f"minimal case: `{f.case}`") in markdown
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        write_files(summary, directory)
        assert sorted(p.name for p in directory.iterdir()) == ["equivalence.html", "equivalence.md", "figures.json"]
        assert (directory / "equivalence.html").read_bytes().decode("utf-8") == page(summary)
        assert (directory / "equivalence.md").read_bytes().decode("utf-8") == markdown
        back = _check_figures(directory, summary)
        render_diff(diff_runs(back, summary))
        assert not diff_runs(summary, summary).regressed, "a run compared with itself regressed"
        assert not diff_runs(back, summary).regressed, "a run compared with its own figures.json regressed"


@given(records=runs)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_drawn_run_survives_its_stream_and_renders_from_the_command_line(records: list[Record]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        stream = ResultStream(directory / "results.jsonl")
        for r in records:
            stream.write(r)
        stream.close()
        back = list(read_stream(directory / "results.jsonl"))
        # by their text: NaN is not equal to itself, and -0.0 is equal to 0.0
        assert [dumps(r) for r in back] == [dumps(r) for r in records]
        summary = summarize(records)
        with contextlib.redirect_stdout(io.StringIO()):
            status = main([str(directory)])
        assert status == (1 if summary.failures else 0)
        # bytes, decoded: read_text would turn the "\r\n" of a name into "\n"
        _check_page((directory / "equivalence.html").read_bytes().decode("utf-8"), summary)
        _check_figures(directory, summary)
        with contextlib.redirect_stdout(io.StringIO()):
            main(["compare", str(directory / "figures.json"), str(directory)])


#: the measured case (issue #50): a failing case whose comparisons mix an infinite max|diff|
#: with finite ones; the session ended in a traceback, equivalence.html was 0 bytes and
#: equivalence.md and figures.json were not written
INFINITE = CaseResult(
    1,
    "kernel:vs_reference",
    "w[4, 4] float16 · kernel my:ns",
    status="failed",
    message="2 of 3 comparisons failed",
    reproduce="pytest x",
    comparisons=(
        Comparison("w", (4, 4), bitwise=False, passed=False, max_abs_diff=math.inf, max_ulp=math.inf, mismatches=1),
        Comparison("w", (4, 4), step=1, bitwise=False, passed=False, max_abs_diff=0.25, max_ulp=9.0, mismatches=3),
        Comparison("w", (4, 4), step=2, bitwise=False, max_abs_diff=1e-3, max_ulp=1.0, mismatches=1),
    ),
)


def test_a_failing_case_with_infinite_and_finite_differences_is_in_every_report_file(tmp_path: Path) -> None:
    records: list[Record] = [Header(impl="my:ns"), INFINITE]
    stream = ResultStream(tmp_path / "results.jsonl")
    for r in records:
        stream.write(r)
    stream.close()
    summary = summarize(records)
    assert "FAILED kernel:vs_reference" in _terminal(summary)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main([str(tmp_path)]) == 1
    assert "FAILED kernel:vs_reference" in out.getvalue()
    html = (tmp_path / "equivalence.html").read_text(encoding="utf-8")
    _check_page(html, summary)
    assert "max|diff| by step (columns) and tensor (rows)" in html and "w step 0: max|diff| inf" in html
    markdown = (tmp_path / "equivalence.md").read_text(encoding="utf-8")
    assert markdown == to_markdown(summary) and "**FAILED** `kernel:vs_reference`" in markdown
    assert "| inf | inf |" in markdown
    data = _strict_json((tmp_path / "figures.json").read_text(encoding="utf-8"))
    assert data["gates"]["kernel:vs_reference"]["worst_abs_diff"] == "inf"
    assert from_figures(data).gates["kernel:vs_reference"].worst_abs_diff == math.inf


def test_a_nan_against_a_number_reads_nan_in_every_report_file(tmp_path: Path) -> None:
    """``harness.verdicts.compare`` gives a NaN against a number a max|diff| of NaN (it was inf, which
    read as a number's difference); each file shows it as nan, after a finite one too."""
    nan = CaseResult(
        1, "one_step", "w[4] float32 · world 2", "failed", "2 of 2 comparisons failed", reproduce="pytest x",
        comparisons=(
            Comparison("w", (4,), step=0, bitwise=False, passed=False, max_abs_diff=0.25, max_ulp=9.0, mismatches=1),
            Comparison("w", (4,), step=1, bitwise=False, passed=False, max_abs_diff=math.nan, max_ulp=math.inf,
                       mismatches=1, expected_at_worst=2.0, actual_at_worst=math.nan),
        ),
    )  # fmt: skip
    summary = summarize([Header(), nan])
    assert math.isnan(summary.gates["one_step"].worst_abs_diff or 0.0)
    write_files(summary, tmp_path)
    assert re.search(r"one_step .* nan +inf ", _terminal(summary)), _terminal(summary)
    assert "| nan | inf |" in (tmp_path / "equivalence.md").read_text(encoding="utf-8")
    html = (tmp_path / "equivalence.html").read_text(encoding="utf-8")
    _check_page(html, summary)
    assert '<td class="num">nan</td>' in html and "w step 1: max|diff| nan" in html
    data = _strict_json((tmp_path / "figures.json").read_text(encoding="utf-8"))
    assert data["gates"]["one_step"]["worst_abs_diff"] == "nan"
    assert math.isnan(from_figures(data).gates["one_step"].worst_abs_diff or 0.0)


def test_a_nan_difference_is_the_gate_s_worst_whatever_the_order_it_came_in() -> None:
    nan = Comparison("w", (4,), bitwise=False, passed=False, max_abs_diff=math.nan, mismatches=4)
    big = Comparison("w", (4,), step=1, bitwise=False, passed=False, max_abs_diff=2.0, mismatches=4)
    for order in ((nan, big), (big, nan)):
        g = summarize([Header(), CaseResult(1, "g", "c", "failed", comparisons=order)]).gates["g"]
        assert math.isnan(g.worst_abs_diff or 0.0), order
    base = summarize([Header(), CaseResult(1, "g", "c", "failed", comparisons=(big,))])
    now = summarize([Header(), CaseResult(1, "g", "c", "failed", comparisons=(big, nan))])
    assert diff_runs(base, now).regressed and not diff_runs(now, base).regressed


def test_a_renderer_that_raises_leaves_the_report_files_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = summarize([Header(), INFINITE])
    write_files(summary, tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def broken(summary: RunSummary) -> str:
        raise RuntimeError("a renderer's bug")

    monkeypatch.setattr(reports.files, "to_markdown", broken)
    with pytest.raises(RuntimeError, match="a renderer's bug"):
        write_files(summary, tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before, "a file emptied, or a temporary left"


def test_a_gate_without_cases_renders_and_its_figures_read_back(tmp_path: Path) -> None:
    """Only a ``figures.json`` holds one (``summarize`` makes a gate of a case)."""
    summary = RunSummary(Header(), {"empty": GateSummary("empty")})
    assert "empty" in _terminal(summary) and "| empty |" in to_markdown(summary)
    _check_page(page(summary), summary)
    write_files(summary, tmp_path)
    assert _check_figures(tmp_path, summary).gates["empty"] == summary.gates["empty"]
    assert from_figures(figures(summary)).gates["empty"] == summary.gates["empty"]
