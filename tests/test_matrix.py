"""Claims about the compatibility matrix: each cell says what its gate's cases did (bitwise,
in a tier, fails with its minimal case, crashes with its message, not supported with the
declaration), and a deliberately broken adapter fails the cells that ShardedMuon passes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from support import REPO, open_in_chromium, repo_env, run_python

from harness.matrix import row_of
from reports.matrix import Matrix, render_html, render_markdown
from reports.records import CaseResult, Comparison, Header, Skip


def _case(i: int, gate: str, status: str = "passed", **comparison: object) -> CaseResult:
    c = Comparison("w0", (4, 4), **comparison)  # type: ignore[arg-type]
    return CaseResult(
        i, gate, f"w0[4, 4] · case {i}", status, message=f"{status} on rank 1", comparisons=(c,), layout="fsdp"
    )  # type: ignore[arg-type]


def test_each_cell_says_what_its_gates_cases_did() -> None:
    records = [
        Header(torch="2.13.0+cpu", backend="gloo"),
        _case(1, "one_step"),
        _case(2, "several_steps", "failed", bitwise=False, passed=False, max_abs_diff=0.5),
        _case(3, "training", tier="reduction_order", tier_kind="tolerance", bitwise=False, max_abs_diff=1e-3),
        _case(4, "robust:empty-local-shards", "hang"),
        Skip(
            "checkpoint", "checkpoint: not run: its claim is a checkpoint round trip, and x does not declare checkpoint"
        ),
        Skip("edge:bf16-33x17", "edge:bf16-33x17: not run: narrowed for x:y: w bfloat16 → float32 (bf16 not declared)"),
    ]
    row = row_of("x:y", "x 1.0", records)
    cells = {gate: (c.status, c.detail) for gate, c in row.gates.items()}
    assert cells["one_step"] == ("bitwise", "1/1")
    assert cells["several_steps"] == ("differs", "differs from reference (max|diff| 0.5) at w0[4, 4] · case 2")
    assert cells["training"] == ("in tier", "reduction_order, max|diff| 0.001")
    assert cells["robust:empty-local-shards"] == ("crashes", "hang at w0[4, 4] · case 4: hang on rank 1")
    assert cells["checkpoint"] == ("not supported", "does not declare checkpoint")
    assert cells["edge:bf16-33x17"] == (
        "not supported",
        "its point narrowed away: w bfloat16 → float32 (bf16 not declared)",
    )
    assert row.layouts["fsdp"].status == "crashes"  # a hang among its cases
    markdown = render_markdown(Matrix([row]))
    assert markdown.splitlines()[0].startswith("| package | adapter | torch, backend | checkpoint |")
    assert "differs (1): differs from reference (max\\|diff\\| 0.5)" in markdown
    assert '<td class="cell crashes" title="robust:empty-local-shards: crashes (1): hang at' in render_html(
        Matrix([row])
    )


def test_a_cell_whose_cases_were_within_causes_or_not_judged_says_so_never_bitwise_nor_fails() -> None:
    """A gate whose cases differed only within the adapter's causes is within causes, with how far
    inside; one whose every case could not be judged is not judged; neither reads as bitwise, and
    a case not judged never counts as a failure of its layout."""
    differs = {"bitwise": False, "passed": False, "max_abs_diff": 1e-3}
    within = dataclasses.replace(_case(1, "one_step", **differs), status="within causes", figures={"cause_reach": 0.3})
    unjudged = dataclasses.replace(_case(2, "several_steps", **differs), status="not judged")
    row = row_of("x:y", "x 1.0", [Header(torch="2.13.0+cpu", backend="gloo"), within, unjudged])
    assert row.gates["one_step"].text() == "within causes (1): 1 within its causes, ≤ 0.3 of the tier"
    assert row.gates["several_steps"].status == "not judged"
    assert row.layouts["fsdp"].text() == "within causes (2): 1 of 2 cases within its causes, 1 not judged"
    assert 'class="cell within"' in render_html(Matrix([row])) and 'class="cell judged"' in render_html(Matrix([row]))


def test_a_cell_within_causes_at_none_of_their_tier_says_equal_in_value() -> None:
    """A reach of 0 (every difference a zero's sign) read "≤ 0 of the tier"."""
    signs = {"bitwise": False, "passed": False, "max_abs_diff": 0.0, "mismatches": 1}
    within = dataclasses.replace(_case(1, "one_step", **signs), status="within causes", figures={"cause_reach": 0.0})
    row = row_of("x:y", "x 1.0", [Header(torch="2.13.0+cpu", backend="gloo"), within])
    assert row.gates["one_step"].text() == "within causes (1): 1 within its causes, equal in value"


def test_a_cell_that_differs_by_nan_says_nan_wherever_the_nan_came() -> None:
    nan = {"bitwise": False, "passed": False, "max_abs_diff": float("nan")}
    big = {"bitwise": False, "passed": False, "max_abs_diff": 0.5}
    header = Header(torch="2.13.0+cpu", backend="gloo")
    for first, second in ((nan, big), (big, nan)):
        case = _case(1, "one_step", "failed", **first)
        case = dataclasses.replace(case, comparisons=(*case.comparisons, Comparison("w1", (4, 4), **second)))  # type: ignore[arg-type]
        assert "(max|diff| nan)" in row_of("x:y", "x 1.0", [header, case]).gates["one_step"].detail


def test_kernels_get_a_table_of_their_own_under_its_title() -> None:
    header = Header(torch="2.13.0+cpu", backend="gloo")
    optimizer = row_of("x:muon", "x 1.0", [header, _case(1, "one_step")])
    kernel = row_of("y:ns", "y 2.0", [header, _case(2, "kernel:vs_reference")], kind="kernel")
    markdown = render_markdown(Matrix([kernel, optimizer]))
    optimizers, kernels = markdown.split("**Newton–Schulz kernels (`--kernel`)**")
    assert optimizers.startswith("**Optimizers (`--impl`)**") and "| x:muon |" in optimizers
    assert "kernel:vs_reference" not in optimizers and "one_step" not in kernels
    assert "| y 2.0 | y:ns | 2.13.0+cpu, gloo | bitwise (1): 1/1 |" in kernels
    assert render_html(Matrix([kernel, optimizer])).count("<table class='mg'>") == 2
    assert not render_markdown(Matrix([optimizer])).startswith("**")


def test_a_row_judged_against_itself_counts_only_its_comparisons_with_itself() -> None:
    ref = Comparison("w0", (4, 4), bitwise=False, passed=False, max_abs_diff=0.5)
    itself = Comparison("w0", (4, 4), against="self")
    case = CaseResult(1, "one_step", "w0[4, 4] · case 1", "passed", comparisons=(ref, itself), layout="own")
    row = row_of("x:y", "x 1.0", [Header(torch="2.13.0+cpu", backend="gloo", against="self"), case])
    assert row.gates["one_step"].text() == "bitwise (1): 1/1" and row.layouts["own"].text() == "bitwise (1): 1/1"
    assert Matrix([row]).table()[1][0][2] == "2.13.0+cpu, gloo, against itself on one device"


@pytest.mark.slow
def test_a_broken_adapter_fails_the_cells_that_sharded_muon_passes_also_when_both_run_at_once(tmp_path: Path) -> None:
    """``--jobs 2`` runs the two adapters side by side; the rows keep the order they were named in."""
    run = run_python(
        "-m", "harness.matrix", "--nproc", "2", "-k", "one_step", "--out", str(tmp_path), "--jobs", "2",
        "distributed_impl:ShardedMuon", "examples.broken_muon:broken_muon",
        timeout=600, cwd=REPO, env=repo_env(),
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [line for line in (tmp_path / "matrix.md").read_text().splitlines() if line.startswith("| ")][1:]
    sharded, broken = (dict(zip(["package", "adapter", "torch", "one_step", "fsdp"], (c.strip().replace("\\|", "|") for c in r.strip("|").split(" | ")), strict=False)) for r in rows)  # fmt: skip
    assert sharded["one_step"].startswith("bitwise ("), sharded
    assert broken["one_step"].startswith("differs ("), broken
    assert "differs from reference (max|diff| " in broken["one_step"] and " at w0[" in broken["one_step"], broken


def test_an_adapter_whose_package_does_not_import_gets_a_row_that_says_so() -> None:
    from harness.matrix import Adapter

    assert Adapter("no_such_package:muon").package() == (
        "no_such_package:muon (does not import: ModuleNotFoundError: No module named 'no_such_package')"
    )
    row = row_of("no_such_package:muon", "no_such_package:muon", [], note="usage error")
    assert Matrix([row]).table()[1][0][2] == "– (did not run)"


#: the published Newton–Schulz kernels' adapters
KERNELS = ["examples.gram_newton_schulz_adapter:gram_newton_schulz"]


def _tables(markdown: str) -> list[dict[str, dict[str, str]]]:
    """Each Markdown table of the matrix as ``{adapter: {column: cell}}``."""
    tables: list[list[list[str]]] = []
    for line in markdown.splitlines():
        if not line.startswith("|"):
            if tables and tables[-1]:
                tables.append([])
            continue
        if not tables:
            tables.append([])
        if line.startswith("| "):  # not the |---| line
            tables[-1].append([c.strip().replace("\\|", "|") for c in line.strip("|").split(" | ")])
    return [{cells[1]: dict(zip(t[0], cells, strict=True)) for cells in t[1:]} for t in tables if t]


#: what each adapter's row must show on CPU CI: the package it needs, and its cell checks
EXPECTED: dict[str, tuple[str, Callable[[dict[str, str]], bool]]] = {
    "examples.torch_muon:torch_muon": ("torch", lambda row: row["edge:uneven-7x5"].startswith("bitwise (1)")),
    "examples.pytorch_optimizer_adapter:muon": (
        "pytorch_optimizer",
        lambda row: row["edge:uneven-7x5"].startswith("bitwise (1)"),
    ),
    "examples.pytorch_optimizer_adapter:muon_clip": (
        "pytorch_optimizer",
        lambda row: row["edge:uneven-7x5"].startswith("bitwise (1)"),
    ),
    "examples.pytorch_optimizer_adapter:distributed_muon": (
        "pytorch_optimizer",
        lambda row: "invalid tensor size" in row["edge:no-grad-and-zero-grad"],
    ),
    "examples.keller_muon_adapter:keller_muon": ("muon", lambda row: row["tier:causes"].startswith("in tier (")),
    "examples.muon_fsdp2_adapter:muon_fsdp2": (
        "muon_fsdp2",
        lambda row: row["edge:uneven-7x5"].startswith("crashes (1): collective mismatch"),
    ),
    "examples.torchtitan_adapter:dist_muon": (
        "torchtitan",
        lambda row: row["edge:uneven-7x5"] == "not supported: does not declare cpu",
    ),
    # GPU-only packages: their rows say that they do not import
    "examples.dtensor_muon_adapter:dtensor_muon": (
        "torch",
        lambda row: "(does not import: ModuleNotFoundError: No module named" in row["package"],
    ),
    "examples.emerging_optimizers_adapter:muon": (
        "torch",
        lambda row: "(does not import: ModuleNotFoundError: No module named" in row["package"],
    ),
}
#: every adapter of a published Muon
PEERS = list(EXPECTED)


def _matrix(tmp_path: Path, *adapters: str) -> list[dict[str, dict[str, str]]]:
    """The matrix's tables for ``adapters`` (``--kernel`` ones included), on the two hand-picked
    edge cases whose cells are checked and the cause gate (each one case, no shrinking:
    muon-fsdp2 compiles per shape); the probe pass has a test of its own (below)."""
    run = run_python(
        "-m", "harness.matrix", "--nproc", "2", "--profile", "dev", "--timeout", "300", "--no-probe",
        "-k", "uneven-7x5 or no-grad-and-zero-grad or declared_difference", "--out", str(tmp_path), *adapters,
        timeout=900, cwd=REPO, env=repo_env(),
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return _tables((tmp_path / "matrix.md").read_text())


@pytest.mark.slow
@pytest.mark.peers
@pytest.mark.parametrize("adapter", PEERS)
def test_the_matrix_runs_every_installed_peer_on_the_dev_profile(tmp_path: Path, adapter: str) -> None:
    """What CI runs of the compatibility matrix: each adapter's row, one matrix run each (so that
    xdist spreads them); the whole matrix is a command of its own (``python -m harness.matrix``)."""
    package, holds = EXPECTED[adapter]
    pytest.importorskip(package, reason="the peers extra and examples/peers-no-deps.txt")
    (rows,) = _matrix(tmp_path, adapter)
    assert set(rows) == {adapter}, sorted(rows)
    assert holds(rows[adapter]), rows[adapter]


@pytest.mark.slow
@pytest.mark.peers
def test_the_matrix_gives_the_published_kernels_a_table_of_their_own(tmp_path: Path) -> None:
    pytest.importorskip("gram_newton_schulz", reason="the peers extra and examples/peers-no-deps.txt")
    (kernels,) = _matrix(tmp_path, *(a for k in KERNELS for a in ("--kernel", k)))
    assert set(kernels) == set(KERNELS), sorted(kernels)
    gram = kernels["examples.gram_newton_schulz_adapter:gram_newton_schulz"]
    assert gram["kernel:vs_reference"].startswith("differs ("), gram  # float16 inside, against fp32's tier
    assert gram["kernel:oracle"].startswith("in tier (8): oracle: the gate's own verdict in it"), (
        gram
    )  # as the report says


def test_the_matrix_page_is_a_coloured_grid_that_renders_in_headless_chromium(tmp_path: Path) -> None:
    """Each cell its verdict's colour and first words; the whole verdict on hover and click."""
    header = Header(torch="2.13.0+cpu", backend="gloo")
    records = [header, _case(1, "one_step"), _case(2, "several_steps", "failed", bitwise=False, passed=False)]
    page = tmp_path / "matrix.html"
    page.write_text(render_html(Matrix([row_of("x:y", "x 1.0", records)])), encoding="utf-8")
    texts, shot = open_in_chromium(page, tmp_path / "profile")
    assert "bitwise (1)" in texts and "differs (1)" in texts, texts
    assert any(t.startswith("bitwise: every comparison had the same bits") for t in texts), texts
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 10_000, "the page rendered blank"


def test_the_matrix_page_is_a_grid_of_verdicts_with_their_prose_beneath_it() -> None:
    """Each cell its verdict's colour and first words, linked to its line beneath the grid; a row's
    identical verdicts said once, naming their columns; a plainly bitwise cell has no line."""
    header = Header(torch="2.13.0+cpu", backend="gloo")
    cpu = "its ranks run on cpu, and x:y does not declare cpu"
    row = row_of("x:y", "x 1.0", [
        header,
        _case(1, "one_step"),
        _case(2, "several_steps", "failed", bitwise=False, passed=False, max_abs_diff=0.5),
        Skip("checkpoint", f"checkpoint: not run: {cpu}"),
        Skip("hybrid_groups", f"hybrid_groups: not run: {cpu}"),
    ])  # fmt: skip
    page = render_html(Matrix([row]))
    grid, prose = page.split("what each cell says</h2>")
    assert '<td class="cell bitwise" title="one_step: bitwise (1): 1/1">bitwise (1)</td>' in grid
    assert '<td class="cell differs" title="several_steps: differs (1): differs' in grid
    assert '<a href="#m0-0-1">differs (1)</a>' in grid and '<a href="#m0-0-0">not supported</a>' in grid
    assert '<li id="m0-0-0"><b>checkpoint, hybrid_groups</b>: not supported: does not declare cpu</li>' in prose
    assert '<li id="m0-0-1"><b>several_steps</b>: differs (1): differs from reference (max|diff| 0.5)' in prose
    assert "one_step" not in prose and prose.count("<li") == 2 + 1  # and the fsdp layout's failed case


def test_every_verdict_of_the_matrix_has_its_colour() -> None:
    from reports.matrix import _status_class

    verdicts = {
        "bitwise (1): 1/1": "bitwise", "holds (1): nothing compared": "holds", "in tier (2): reduction_order": "tier",
        "within causes (3): ≤ 0.74 of the tier": "within", "not judged (1): a bf16 weight": "judged",
        "differs (1): differs": "differs", "accepted (1): finding 27": "accepted", "crashes (1): hang": "crashes", "not supported: does not declare cpu": "not",
        "not run": "not", "not declared: tried: crashes (1): error": "crashes probed",
    }  # fmt: skip
    assert {text: _status_class(text) for text in verdicts} == verdicts


def test_a_feature_an_adapter_does_not_declare_is_tried_and_its_cell_says_what_happened() -> None:
    """A cell skipped for an undeclared feature is never a bare "not supported": the probe run's
    verdict replaces it; a narrowed cell says what its cases did unnarrowed; a layout the adapter
    never ran gets the probe's cell. A device it does not declare stays not supported."""
    from harness.matrix import with_probe

    header = Header(torch="2.13.0+cpu", backend="gloo")
    declared = row_of("x:y", "x 1.0", [
        header,
        dataclasses.replace(_case(1, "several_steps"), narrowed=("w0 bfloat16 → float32 (bf16 not declared)",)),
        Skip("checkpoint", "checkpoint: not run: its claim is a checkpoint round trip, and x:y does not declare checkpoint"),
        Skip("edge:gpu", "edge:gpu: not run: its ranks run on cpu, and x:y does not declare cpu"),
    ])  # fmt: skip
    probe = row_of("x:y", "x 1.0", [
        header,
        _case(2, "several_steps", "failed", bitwise=False, passed=False, max_abs_diff=0.25),
        _case(3, "checkpoint", "error"),
        dataclasses.replace(_case(4, "layouts"), layout="tp"),
    ])  # fmt: skip
    row = with_probe(declared, probe)
    assert row.gates["checkpoint"].text().startswith("not declared: tried: crashes (1): error at w0[4, 4] · case 3")
    assert "not declared, tried unnarrowed: differs (1): differs from reference" in row.gates["several_steps"].text()
    assert row.gates["edge:gpu"].text() == "not supported: does not declare cpu"
    assert row.layouts["tp"].text() == "not declared: tried: bitwise (1): 1/1"
    assert '<td class="cell crashes probed"' in render_html(Matrix([row]))


@pytest.mark.slow
def test_the_matrix_tries_a_feature_its_adapter_does_not_declare(tmp_path: Path) -> None:
    """torch.optim.Muon declares no 3-D parameters (it refuses them); the hand-picked expert
    stack, skipped for that, is run anyway and its cell says what happened."""
    run = run_python(
        "-m", "harness.matrix", "--nproc", "2", "-k", "experts-1x5x5", "--out", str(tmp_path),
        "examples.torch_muon:torch_muon",
        timeout=600, cwd=REPO, env=repo_env(),
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (row,) = _tables((tmp_path / "matrix.md").read_text())[0].values()
    assert row["edge:experts-1x5x5"].startswith("not declared: tried: "), row
    assert (tmp_path / "examples.torch_muon_torch_muon-probe" / "results.jsonl").is_file()


def test_the_matrix_reads_back_as_written_and_links_each_cell_to_its_finding() -> None:
    """``matrix.json`` holds every cell, the run that made it and the findings a reader numbered;
    the grid links a cell's line to its finding; a failure the run's --accept file names is
    accepted, never bitwise."""
    from reports.matrix import render_grid
    from reports.records import Accepted

    records = [
        Header(torch="2.13.0+cpu", backend="gloo", git_commit="abc1234"),
        _case(1, "one_step", "failed", bitwise=False, passed=False, max_abs_diff=0.5),
        _case(2, "several_steps", "failed", bitwise=False, passed=False, max_abs_diff=0.25),
        Accepted("several_steps", "finding 27", "bf16 momentum, documented"),
    ]
    row = row_of("x:y", "x 1.0", records)
    assert (row.gates["one_step"].status, row.gates["several_steps"].status) == ("differs", "accepted")
    assert row.gates["several_steps"].detail == "finding 27: bf16 momentum, documented" and row.commit == "abc1234"
    run = {"command": "python -m harness.matrix x:y", "commit": "abc1234", "date": "2026-12-07", "machine": "m"}
    matrix = Matrix([row], run, {"x:y": {"one_step": [3]}})
    assert Matrix.from_json(matrix.to_json()) == matrix
    grid = render_grid(matrix)
    assert '<td class="cell accepted" title="several_steps: accepted (1): finding 27' in grid
    assert '(<a href="#finding-3">finding 3</a>)</li>' in grid and "commit: abc1234" in grid
    assert grid.startswith('<div class="muongate-matrix"><style>.muongate-matrix table.mg{')


def test_a_layout_cell_with_a_crashed_case_says_crashes_not_differs() -> None:
    records = [Header(torch="2.13.0+cpu", backend="gloo"), _case(1, "one_step"), _case(2, "robust:x", "hang")]
    assert row_of("x:y", "x 1.0", records).layouts["fsdp"].text() == (
        "crashes (2): 1 of 2 cases failed (hang among them)"
    )


def test_a_cell_with_cases_no_tier_could_judge_counts_them_beside_its_verdict() -> None:
    """A gate whose other cases were bitwise reads bitwise, as the report's outcome does, and says
    how many of its cases were not judged, on the grid's prose line too: never a bare bitwise."""
    from reports.matrix import render_html

    records = [
        Header(torch="2.13.0+cpu", backend="gloo"),
        _case(1, "one_step"),
        _case(2, "one_step", "not judged", bitwise=False, passed=False, max_abs_diff=0.0156),
    ]
    row = row_of("x:y", "x 1.0", records)
    assert row.gates["one_step"].text() == "bitwise (2): 1/2; 1 of 2 cases not judged"
    assert "<b>one_step</b>: bitwise (2): 1/2; 1 of 2 cases not judged</li>" in render_html(Matrix([row]))
