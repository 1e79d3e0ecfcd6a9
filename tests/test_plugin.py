"""Claims about the pytest plugin, checked end to end with ``pytester`` in pytest sessions of
their own (forked from the tests' zygote, ``tests/zygote.py``, except the claims about what
another project's fresh session pays and sees, which start afresh): options and markers exist, usage errors say how to fix them, a planted hang
ends the case instead of the run, and -x / --lf / -k behave as in any pytest suite.

The plugin is installed as an entry point, so it is loaded into every pytest session of an
environment that has muongate: another project's session must not pay for it (no torch, no
pool, hypothesis's own default profile, the same start-up time within 0.5 s, best of five
runs each way so that a busy machine does not decide), and a gate session keeps the profile
its user chose."""

from __future__ import annotations

import ast
import json
from collections import Counter
from xml.etree import ElementTree

import pytest
from support import REPO, run_pytest

GATE_FILE = """
import pytest
from harness.tasks import selftest as tasks

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
def suite(other_project: pytest.Pytester) -> pytest.Pytester:
    other_project.makeconftest('pytest_plugins = ["harness.plugin"]')
    other_project.makepyfile(test_gates=GATE_FILE)
    return other_project


def test_help_lists_the_muongate_options(suite: pytest.Pytester) -> None:
    result = run_pytest(suite, "--help", timeout=120)
    result.stdout.fnmatch_lines(
        ["*muongate*", "*--nproc=NPROC*", "*--gate-device*", "*--case-timeout*", "*--gate-report=DIR*"]
    )


BAD_OPTIONS = [
    (["--nproc", "0"], {}, "ERROR: --nproc 0: the pool needs at least one rank; try --nproc 2"),
    (["--case-timeout", "0"], {}, "ERROR: --case-timeout 0: a case needs a positive, finite number of seconds; try *"),
    (["--case-timeout", "-1"], {}, "ERROR: --case-timeout -1: a case needs a positive, finite number of seconds; *"),
    (["--case-timeout", "inf"], {}, "ERROR: --case-timeout inf: a case needs a positive, finite number of seconds; *"),
    (["--rank-threads", "0"], {}, "ERROR: --rank-threads 0: a rank needs at least one thread; try --rank-threads 1"),
    (["--hypothesis-profile", "nope"], {}, "ERROR: --hypothesis-profile nope: no such hypothesis profile; try ci, *"),
    (
        [],
        {"MUONGATE_HYPOTHESIS_PROFILE": "nope"},
        "ERROR: MUONGATE_HYPOTHESIS_PROFILE nope: no such hypothesis profile*",
    ),
    (["--gate-report", "conftest.py"], {}, "ERROR: --gate-report conftest.py: that is a file; name a directory*"),
    (["--gate-device", "tpu"], {}, "*--gate-device: invalid choice: 'tpu'*"),
    (["--impl", "nowhere:muon"], {}, "ERROR: --impl nowhere:muon: No module named 'nowhere' on sys.path (*"),
    (["--kernel", "reference"], {}, "ERROR: --kernel reference: 'reference' is not of the form MODULE:NAME*"),
    (["--gate-baseline", "missing.json"], {}, "ERROR: --gate-baseline missing.json: *expected the figures.json*"),
    (["--layout-from", "missing.json"], {}, "ERROR: --layout-from missing.json: cannot be read: No such file*"),
    (["--layout-from", "conftest.py"], {}, "ERROR: --layout-from conftest.py: not JSON (*"),
    (
        [f"--layout-from={REPO / 'examples' / 'captures' / 'llama-fsdp16.json'}", "--nproc", "1"],
        {},
        "ERROR: --layout-from */llama-fsdp16.json: nothing of it can be replayed:",
    ),
    (
        # the next line of the same refusal: one line per reason, each naming the parameters
        [f"--layout-from={REPO / 'examples' / 'captures' / 'llama-fsdp16.json'}", "--nproc", "1"],
        {},
        "21 named part(s) not judged: mesh [[]16]: a split on each of its dims needs --nproc 2 or more: parameter *",
    ),
    (
        ["--layout-from", str(REPO / "examples" / "captures" / "llama-fsdp16.json")],
        {},
        "ERROR: --layout-from */llama-fsdp16.json: pytest took * for a test path * write --layout-from=*",
    ),
    (
        ["--reference", "reference:LowBitAdamW"],
        {},
        "ERROR: --reference reference:LowBitAdamW: muongate ships no candidate of LowBitAdamW; name one with "
        "--impl MODULE:FACTORY",
    ),
    (
        ["--reference", "AdamW"],
        {},
        "ERROR: --reference AdamW: 'AdamW' is not of the form MODULE:NAME; muongate's references are reference:Muon, "
        "reference:NorMuon, reference:AdamW, *, and none (with --against self)",
    ),
    (
        ["--reference", "reference:Adam"],
        {},
        "ERROR: --reference reference:Adam: module 'reference' has no attribute 'Adam'; muongate's references are "
        "reference:Muon, *",
    ),
    (["--reference", "reference:muon_update"], {}, "ERROR: --reference reference:muon_update: *"),
    (["--reference", "reference:apply_update"], {}, "ERROR: --reference reference:apply_update: declares no DEFAULTS*"),
    (
        ["--reference", "none", "--impl", "torch.optim:AdamW"],
        {},
        "ERROR: --reference none judges a candidate against itself on one device only: add *--against self",
    ),
    (
        ["--reference", "reference:Muon", "--impl", "gates.examples.torch_adam:adamw_for_loop"],
        {},
        "ERROR: --reference reference:Muon with --impl gates.examples.torch_adam:adamw_for_loop, which declares "
        "reference reference:AdamW: drop --reference",
    ),
]


@pytest.mark.parametrize(
    ("args", "env", "line"), BAD_OPTIONS, ids=lambda v: " ".join(v) if isinstance(v, list) else None
)
def test_bad_option_is_a_one_line_usage_error_that_says_the_fix(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str], line: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = run_pytest(suite, *args, timeout=60)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([line])
    assert "Traceback" not in result.stderr.str() and "INTERNALERROR" not in result.stderr.str()


def test_a_factory_the_ranks_cannot_receive_is_refused_at_once(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        closure_impl="def _make():\n    def factory(groups, **settings):\n        pass\n    return factory\n\n\nmuon = _make()\n"
    )
    result = run_pytest(suite, "--impl", "closure_impl:muon", timeout=60)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: --impl closure_impl:muon: the ranks receive it by pickling, and it does not pickle (*"
         "make it a function or class defined at the top level of its module*"]
    )  # fmt: skip


@pytest.mark.parametrize("gate", ["one_step", "several_steps", "checkpoint"])
def test_the_gates_the_docs_name_are_selected_by_that_name_with_k(gate: str) -> None:
    """``-k one_step`` selects the gate the README, the gates page and the report call
    ``one_step``: its test's name holds the gate's name (it once did not, and selected nothing)."""
    source = (REPO / "gates" / "test_optimizer_gates.py").read_text(encoding="utf-8")
    tests = [
        node.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef)
        and f'gate_runner.check("{gate}"' in (ast.get_source_segment(source, node) or "")
    ]
    assert tests and all(gate in name for name in tests), tests


JUNIT_GATE = """
import pytest
import reference
from harness.cases import Case, ParamSpec

@pytest.mark.gate
def test_one_case(gate_runner):
    gate_runner.check("tiny", Case(params=(ParamSpec("w", (4, 4)),), world_size=2, mesh=(2,), reference=reference.Muon))
"""


REPEATS_GATE = """
import pytest
from hypothesis import given, settings, strategies as st
import reference
from harness.cases import Case, ParamSpec
from gates.negative_controls import LocalRowsMuon

def case(side, candidate=None):
    return Case(
        params=(ParamSpec("w", (side, 4)),), world_size=2, mesh=(2,), reference=reference.Muon, candidate=candidate, mode=None
    )

@pytest.mark.gate
@settings(max_examples=30)
@given(case=st.integers(0, 1000).map(lambda i: case(4 + 2 * (i % 2))))  # many choices, two cases
def test_two_cases(gate_runner, case):
    gate_runner.check("two", case)

@pytest.mark.gate
@settings(max_examples=30)
@given(case=st.sampled_from([case(6, LocalRowsMuon)]))
def test_one_failing_case(gate_runner, case):
    gate_runner.check("failing", case)
"""


@pytest.mark.slow
def test_a_gate_runs_each_distinct_case_it_passes_once_and_a_failing_one_whenever_hypothesis_asks(
    suite: pytest.Pytester,
) -> None:
    suite.makepyfile(test_repeats=REPEATS_GATE)
    result = run_pytest(suite, "test_repeats.py", "--nproc", "2", timeout=180)
    result.assert_outcomes(passed=1, failed=1)
    records = [json.loads(line) for line in (suite.path / "gate-report" / "results.jsonl").read_text().splitlines()]
    cases = Counter((r["gate"], r.get("status", "passed")) for r in records if r["kind"] == "case")
    assert cases[("two", "passed")] == 2, cases
    assert cases[("failing", "failed")] >= 2, cases  # found, then replayed by hypothesis as it shrinks and reports


@pytest.mark.slow
def test_gate_figures_reach_junit_xml_and_the_github_step_summary(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    suite.makepyfile(test_junit=JUNIT_GATE)
    summary = suite.path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = run_pytest(suite, "test_junit.py", "--nproc", "2", "--junitxml", "junit.xml", timeout=120)
    result.assert_outcomes(passed=1)
    properties = {p.get("name"): p.get("value") for p in ElementTree.parse(suite.path / "junit.xml").iter("property")}
    assert properties["tiny.cases"] == "1" and properties["tiny.failed"] == "0"
    assert properties["tiny.comparisons"] == properties["tiny.bitwise"] == "4"
    assert "| tiny | candidate | bitwise | 1 | 0 | ref 1/1 | 4/4 |" in summary.read_text()


def test_a_reference_alone_judges_the_candidate_muongate_ships_for_its_family(other_project: pytest.Pytester) -> None:
    """``--reference reference:NorMuon`` without ``--impl`` was refused ("the built-in candidate is a
    Muon"); it runs the family's own candidate (``FAMILIES``), named as the candidate."""
    result = run_pytest(
        other_project, "-p", "harness.plugin", "--pyargs", "gates.test_optimizer_gates", "-k", "one_step",
        "--nproc", "2", "--reference", "reference:NorMuon", "-p", "no:randomly", timeout=300,
    )  # fmt: skip
    assert result.ret == 0, "\n".join(result.outlines[-20:])
    result.stdout.fnmatch_lines(["*candidate distributed_impl:ShardedNorMuon*", "*1 passed*"])


def test_a_named_candidate_whose_every_selected_gate_skipped_is_not_judged_and_fails(
    other_project: pytest.Pytester,
) -> None:
    """Every selected gate skipped before its first case (controls under --impl): no runner started
    and no stream was written; the session said nothing and exited 0 before. Now it says so, and fails."""
    args = ["-p", "harness.plugin", "--pyargs", "gates.test_clip_gates", "-k", "negative", "--nproc", "2"]
    result = run_pytest(other_project, *args, "--impl", "distributed_impl:ShardedMuon", timeout=120)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, "\n".join(result.outlines[-10:])
    result.stdout.fnmatch_lines(
        ["*NOT JUDGED: nothing of the candidate was judged: all * selected gate test(s) skipped*"]
    )
    allowed = run_pytest(
        other_project, *args, "--impl", "distributed_impl:ShardedMuon", "--allow-unjudged", timeout=120
    )
    assert allowed.ret == 0, "\n".join(allowed.outlines[-10:])


def test_cuda_without_a_gpu_is_a_usage_error(suite: pytest.Pytester) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the ranks would share it through the relay")
    result = run_pytest(suite, "--gate-device", "cuda", "--nproc", "2", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--gate-device cuda: no GPU is visible; try --gate-device cpu*"])


@pytest.mark.slow
def test_planted_hang_finishes_the_run_with_header_report_and_no_marker_warning(suite: pytest.Pytester) -> None:
    result = run_pytest(
        suite,
        "-m",
        "gate",
        "--nproc",
        "2",
        "-W",
        "error::pytest.PytestUnknownMarkWarning",
        "-p",
        "no:randomly",
        timeout=300,
    )
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["muongate *: torch *, backend gloo on cpu, nproc 2, hypothesis * profile ci"])
    assert (suite.path / "gate-report" / "results.jsonl").exists()


@pytest.mark.slow
def test_exitfirst_and_last_failed_rerun_only_what_failed(suite: pytest.Pytester) -> None:
    first = run_pytest(suite, "-m", "gate", "-k", "planted_failure or works_after", "-x", timeout=300)
    first.assert_outcomes(passed=1, failed=1)
    again = run_pytest(suite, "-m", "gate", "--lf", timeout=300)
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(["*run-last-failure*"])


UNRELATED_TEST = """
import multiprocessing
import sys

from hypothesis import given, settings, strategies as st
from hypothesis._settings import is_in_ci


# hypothesis's own choice: its "ci" profile on a CI machine (the CI variable and the like), else
# "default"; both draw 100 examples, muongate's ci 200.
CHOSEN = "ci" if is_in_ci() else "default"


@given(st.integers())
def test_an_ordinary_property(x):
    assert settings.get_current_profile_name() == CHOSEN, settings.get_current_profile_name()
    assert settings().max_examples == 100, settings()
    assert "torch" not in sys.modules
    assert multiprocessing.active_children() == []
"""


@pytest.fixture
def unrelated(other_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """Another project: one hypothesis test, no muongate conftest, the plugin loaded by name."""
    monkeypatch.delenv("MUONGATE_HYPOTHESIS_PROFILE", raising=False)
    other_project.makepyfile(test_unrelated=UNRELATED_TEST)
    return other_project


def test_an_unrelated_session_keeps_hypothesis_default_profile_and_never_imports_torch(
    unrelated: pytest.Pytester,
) -> None:
    result = unrelated.runpytest_subprocess("-p", "harness.plugin", "-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=1)
    assert not [line for line in result.outlines if line.startswith("muongate ")], "a header line needs torch"


MUONGATE_MODULES_TEST = """
import sys


def test_what_is_imported():
    ours = ("harness", "reference", "distributed_impl", "gates", "reports", "torch")
    print("imported:", sorted(m for m in sys.modules if m.split(".")[0] in ours))
"""


def test_an_unrelated_session_imports_nothing_of_muongate_but_the_plugin_its_options_and_its_session(
    other_project: pytest.Pytester,
) -> None:
    """What the plug-in costs another project's session is its import: the plug-in, its options
    and its session object's rooms (the session, where ranks run, the profiles, what it resolves, the
    verdict), nothing else of
    muongate and no torch (how long that takes is measured by ``python -m benchmarks.plugin_startup``,
    not here)."""
    other_project.makepyfile(test_modules=MUONGATE_MODULES_TEST)
    result = other_project.runpytest_subprocess("-p", "harness.plugin", "-p", "no:cacheprovider", "-s", timeout=120)
    result.assert_outcomes(passed=1)
    imported = [
        "harness",
        "harness.plugin",
        "harness.plugin.devices",
        "harness.plugin.gate_session",
        "harness.plugin.options",
        "harness.plugin.profiles",
        "harness.plugin.resolve",
        "harness.plugin.verdict",
    ]
    assert f"imported: {imported}\n" in result.stdout.str()


PROFILE_TEST = """
import pytest
from hypothesis import settings


@pytest.mark.gate
def test_profile():
    print("profile:", settings.get_current_profile_name())
"""

OWN_PROFILE = """
from hypothesis import settings

pytest_plugins = ["harness.plugin"]
settings.register_profile("ours", max_examples=3)
settings.load_profile("ours")
"""

PROFILE_CHOICES = [
    ("nothing chosen", [], {}, False, "ci"),
    ("--hypothesis-profile", ["--hypothesis-profile", "dev"], {}, False, "dev"),
    ("the variable", [], {"MUONGATE_HYPOTHESIS_PROFILE": "thorough"}, False, "thorough"),
    ("a conftest", [], {}, True, "ours"),
]


@pytest.mark.parametrize(
    ("args", "env", "own_conftest", "profile"), [c[1:] for c in PROFILE_CHOICES], ids=[c[0] for c in PROFILE_CHOICES]
)
def test_a_gate_session_runs_the_profile_its_user_chose_else_ci(
    suite: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: dict[str, str],
    own_conftest: bool,
    profile: str,
) -> None:
    monkeypatch.delenv("MUONGATE_HYPOTHESIS_PROFILE", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if own_conftest:
        suite.makeconftest(OWN_PROFILE)
    suite.makepyfile(test_profile=PROFILE_TEST)
    result = suite.runpytest_subprocess("test_profile.py", "-s", "-p", "no:cacheprovider", *args, timeout=120)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"muongate *: torch *, hypothesis * profile {profile}", f"*profile: {profile}"])


@pytest.mark.slow
def test_this_checkouts_gates_collected_from_elsewhere_keep_the_profile_the_user_chose(
    other_project: pytest.Pytester,
) -> None:
    """The root conftest loads the ``ci`` profile for this repository's own sessions; a session
    elsewhere that collects the checkout's gates imports it during collection, and once did so
    over ``--hypothesis-profile`` (200 cases where the user asked for 20)."""
    result = other_project.runpytest_subprocess(
        "-p", "harness.plugin", "--pyargs", "gates.test_optimizer_gates", "-k", "one_step", "--nproc", "2",
        "--hypothesis-profile", "dev", "-p", "no:cacheprovider", "--gate-report", "report", timeout=300,
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    row = next(
        line
        for line in (other_project.path / "report" / "equivalence.md").read_text().splitlines()
        if line.startswith("| one_step |")
    )
    assert "| 20 |" in row, row


SESSION_TEST = """
from hypothesis import given, settings

from harness.session import gate_config
from muongate_shared import STRATEGY


def test_nproc():
    print("nproc:", gate_config().nproc)


@settings(max_examples=1, database=None)
@given(nproc=STRATEGY)
def test_drawn(nproc):
    print("drawn:", nproc)
"""


def test_a_session_started_inside_another_reads_and_draws_from_its_own_configuration(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate modules' configuration (``harness.session``) belongs to the session that collects
    and runs them: a session pytester starts in this process reads its own ``--nproc``, and draws
    it from a strategy (``drawn``) this session drew first; this test reads and draws its own
    session's again afterwards; outside any session reading it is an error."""
    import contextvars
    import sys
    import types

    from hypothesis import find
    from hypothesis import strategies as st

    from harness.session import drawn, gate_config

    strategy = drawn(lambda config: st.just(config.nproc))
    ours = gate_config().nproc
    assert find(strategy, lambda _: True) == ours
    shared = types.ModuleType("muongate_shared")
    shared.STRATEGY = strategy  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "muongate_shared", shared)
    pytester.makepyfile(test_session=SESSION_TEST)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-s", "--nproc", str(ours + 1))
    result.assert_outcomes(passed=2)
    assert f"nproc: {ours + 1}\n" in result.stdout.str() and f"drawn: {ours + 1}\n" in result.stdout.str()
    assert gate_config().nproc == ours and find(strategy, lambda _: True) == ours
    with pytest.raises(RuntimeError, match="no muongate session is collecting or running tests here"):
        contextvars.Context().run(gate_config)  # an empty context: no session
