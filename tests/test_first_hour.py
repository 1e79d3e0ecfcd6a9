"""Claims about a new user's first hour with the plug-in (issue #50, item 5): a plug-in module
that does not import is one usage line that says where (the file and line of a syntax error,
the inner import that failed and who asked for it, the path a missing module was looked for
on), a candidate can be named by its file's path and runs on the ranks, ``--gate-report DIR``
either works or is refused at once with the spelling that does, and the report names the
family a run trained.

The usage errors end before any rank starts (about a second each), so only the sessions that
run a gate are marked ``slow``."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from support import run_pytest

from reports.records import Header, Training
from reports.summary import summarize
from reports.terminal import render

#: a candidate of its own module: the ranks unpickle its factory as ``my_muon.sharded_muon``
MY_MUON = """
from distributed_impl import ShardedMuon


def sharded_muon(param_groups, **settings):
    return ShardedMuon(param_groups, **settings)
"""

TINY_GATE = """
import pytest
import reference
from harness.cases import Case, ParamSpec

@pytest.mark.gate
@pytest.mark.mine
def test_one_case(gate_runner):
    gate_runner.check("tiny", Case(params=(ParamSpec("w", (4, 4)),), world_size=2, mesh=(2,), reference=reference.Muon))
"""


@pytest.fixture
def project(other_project: pytest.Pytester) -> pytest.Pytester:
    """A project with a configuration of its own (a marker its tests use) and one tiny gate."""
    other_project.makepyprojecttoml('[tool.pytest.ini_options]\nmarkers = ["mine: a marker of this project"]\n')
    other_project.makepyfile(test_tiny=TINY_GATE)
    return other_project


def _usage_line(result: pytest.RunResult) -> str:
    """The session's one usage-error line (and that there is only one, and no traceback)."""
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:] + result.stderr.str()[-2000:]
    err = result.stderr.str()
    assert "Traceback" not in err and "INTERNALERROR" not in err, err[-3000:]
    lines = [line for line in result.stderr.lines if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_a_syntax_error_in_the_impl_module_is_one_usage_line_naming_its_file_and_line(
    project: pytest.Pytester,
) -> None:
    project.makepyfile(their_muon="import torch\n\n\ndef muon(:\n    pass\n")
    line = _usage_line(run_pytest(project, "--impl", "their_muon:muon", timeout=60))
    assert line.startswith(f"ERROR: --impl their_muon:muon: {project.path / 'their_muon.py'} line 4: SyntaxError: "), (
        line
    )
    assert line.endswith(": def muon(:"), line  # the line as written


def test_an_import_error_inside_the_impl_module_names_the_missing_module_and_the_file_that_imports_it(
    project: pytest.Pytester,
) -> None:
    project.makepyfile(their_muon="import torch\nimport nonexistent_pkg\n\n\ndef muon(groups, **settings):\n    pass\n")
    line = _usage_line(run_pytest(project, "--impl", "their_muon:muon", timeout=60))
    assert line.startswith(
        f"ERROR: --impl their_muon:muon: {project.path / 'their_muon.py'} line 2 imports nonexistent_pkg, "
    ), line
    assert "No module named 'their_muon'" not in line


def test_a_module_that_is_on_no_directory_of_the_path_says_so_with_the_path_and_the_fix(
    project: pytest.Pytester,
) -> None:
    line = _usage_line(run_pytest(project, "--impl", "nowhere_muon:muon", timeout=60))
    assert line.startswith("ERROR: --impl nowhere_muon:muon: No module named 'nowhere_muon' on sys.path ("), line
    assert str(project.path) in line, line  # the project's directory, which other_project puts on PYTHONPATH
    assert line.endswith("PYTHONPATH=., or name its file: path/to/nowhere_muon.py:muon"), line


def test_an_exception_the_impl_module_raises_at_import_is_one_usage_line_naming_the_file(
    project: pytest.Pytester,
) -> None:
    project.makepyfile(their_muon="import torch\n\nraise RuntimeError('no GPU, no muon')\n")
    line = _usage_line(run_pytest(project, "--impl", "their_muon:muon", timeout=60))
    assert line == (
        "ERROR: --impl their_muon:muon: importing their_muon raised RuntimeError: no GPU, no muon "
        f"({project.path / 'their_muon.py'} line 3)"
    ), line


@pytest.mark.parametrize("option", ["engine", "kernel", "model", "reference"])
def test_every_plugin_option_says_where_its_module_does_not_compile_in_one_line(
    project: pytest.Pytester, option: str
) -> None:
    project.makepyfile(their_plugin="x = (\n")
    line = _usage_line(run_pytest(project, f"--{option}", "their_plugin:thing", timeout=60))
    assert line.startswith(f"ERROR: --{option} their_plugin:thing: {project.path / 'their_plugin.py'} line 1: "), line
    assert "SyntaxError" in line, line


def test_a_file_path_that_is_no_module_name_is_refused_with_the_rename(project: pytest.Pytester) -> None:
    (project.path / "candidates").mkdir()
    (project.path / "candidates" / "my-muon.py").write_text(MY_MUON, encoding="utf-8")
    line = _usage_line(run_pytest(project, "--impl", "candidates/my-muon.py:sharded_muon", timeout=60))
    assert "by its module name, and my-muon is not one; rename it" in line, line


#: a thread of the session's own: the ranks' forkserver then starts afresh instead of being forked
#: with this session's imports (``harness.ranks.forkserver.safe_to_fork``), so that the ranks
#: import the candidate's module from the ``sys.path`` they are handed, as on a GPU machine
THREAD_CONFTEST = """
import threading

threading.Thread(target=threading.Event().wait, daemon=True).start()
"""


@pytest.mark.slow
def test_an_impl_named_by_its_file_path_runs_through_a_gate_on_the_ranks(project: pytest.Pytester) -> None:
    (project.path / "candidates").mkdir()  # on no PYTHONPATH: only the path names it
    (project.path / "candidates" / "my_muon.py").write_text(MY_MUON, encoding="utf-8")
    project.makeconftest(THREAD_CONFTEST)
    result = run_pytest(
        project, "--pyargs", "gates", "-m", "gate", "--nproc", "2", "-k", "uneven-7x5", "-p", "no:randomly",
        "--impl", "candidates/my_muon.py:sharded_muon", timeout=300,
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    stream = (project.path / "gate-report" / "results.jsonl").read_text(encoding="utf-8")
    records = [json.loads(line) for line in stream.splitlines()]
    assert records[0]["impl"] == "my_muon:sharded_muon", records[0]
    cases = [r for r in records if r["kind"] == "case"]
    assert cases, records
    assert all(r.get("status", "passed") == "passed" and "my_muon:sharded_muon" in r["case"] for r in cases), cases


def test_gate_report_as_two_tokens_that_moved_pytests_rootdir_is_refused_with_the_equals_spelling(
    project: pytest.Pytester, tmp_path: Path
) -> None:
    report = tmp_path / "report"
    report.mkdir()
    line = _usage_line(run_pytest(project, "-m", "gate", "--gate-report", str(report), timeout=60))
    assert line.startswith(f"ERROR: --gate-report {report}: pytest took {report} for a test path"), line
    assert f"(without it: {project.path} and {project.path / 'pyproject.toml'})" in line, line
    assert line.endswith(f"write --gate-report={report}"), line


def test_gate_report_as_two_tokens_beside_pyargs_from_an_empty_directory_is_refused_too(
    other_project: pytest.Pytester, tmp_path: Path
) -> None:
    report = tmp_path / "report"
    report.mkdir()
    line = _usage_line(
        run_pytest(other_project, "--pyargs", "gates", "-m", "gate", "--gate-report", str(report), timeout=60)
    )
    assert line.endswith(f"(without it: {other_project.path} and (none)); write --gate-report={report}"), line


@pytest.mark.slow
def test_an_existing_gate_report_directory_works_with_either_spelling_or_is_refused_with_the_one_that_does(
    project: pytest.Pytester, tmp_path: Path
) -> None:
    outside, inside = tmp_path / "report", project.path / "report"
    outside.mkdir()
    inside.mkdir()
    strict = ("-m", "gate", "--nproc", "2", "-p", "no:randomly", "-W", "error::pytest.PytestUnknownMarkWarning")
    refused = run_pytest(project, *strict, "--gate-report", str(outside), timeout=120)
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines([f"ERROR: --gate-report {outside}: *; write --gate-report={outside}"])
    for spelling in ([f"--gate-report={outside}"], ["--gate-report", "report"]):
        result = run_pytest(project, *strict, *spelling, timeout=120)
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines([f"rootdir: {project.path}", "configfile: pyproject.toml", "test_tiny.py .*"])
    assert (outside / "results.jsonl").is_file() and (inside / "results.jsonl").is_file()


def test_the_training_table_of_an_adamw_run_names_adamw_not_muon() -> None:
    records = [Header(reference="reference:AdamW"), Training("training", "dense", 2, (8.0, 7.5), (8.1, 7.9))]
    buffer = io.StringIO()
    Console(file=buffer, width=140, no_color=True, force_terminal=False, color_system=None).print(
        render(summarize(records))
    )
    text = buffer.getvalue()
    assert "training (FSDP2 + sharded AdamW), bits per byte" in text, text
    assert "sharded Muon" not in text, text


#: a candidate of AdamW that declares a cause of Muon's arithmetic, and one that declares none
#: (judged against whatever family the session names)
ADAM_WITH_MUON_CAUSE = """
import torch
import reference
from harness.candidates import Candidate


@Candidate(reference=reference.AdamW, differences={"plain_quintic"})
def adam(param_groups, **settings):
    return torch.optim.AdamW(param_groups)


@Candidate(differences={"bf16_momentum"})
def muon_like(param_groups, **settings):
    return torch.optim.AdamW(param_groups)
"""


def test_a_difference_its_family_has_no_cause_of_is_refused_naming_the_familys_causes(
    project: pytest.Pytester,
) -> None:
    project.makepyfile(their_adam=ADAM_WITH_MUON_CAUSE)
    line = _usage_line(run_pytest(project, "--impl", "their_adam:adam", timeout=60))
    assert line == (
        "ERROR: --impl their_adam:adam: Candidate differences ['plain_quintic'] are not causes of "
        "reference.AdamW; its causes are ['signed_zero']"
    ), line
    # declared without a reference, it is judged against the session's, and refused there
    line = _usage_line(
        run_pytest(project, "--impl", "their_adam:muon_like", "--reference", "reference:AdamW", timeout=60)
    )
    assert line == (
        "ERROR: --reference reference:AdamW with --impl their_adam:muon_like: its Candidate differences "
        "['bf16_momentum'] are not causes of reference.AdamW; its causes are ['signed_zero']"
    ), line
