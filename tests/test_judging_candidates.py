"""Claims about how the gates judge an ``--impl`` candidate: a gate reports on it only what it
ran in it; narrowed cases say so; the candidate's own single-device self is a second
reference; one gate reports several findings; a reproduce command reproduces."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from support import run_pytest

import reference
from harness import layouts
from harness.candidates import Impl, UnsupportedConvention
from harness.cases import Case, Clip, ParamSpec, QKClip
from reference import AdamW

RAISING = """
import torch


class Raising(torch.optim.Optimizer):
    def __init__(self, param_groups, **settings):
        super().__init__([{"params": g["params"]} for g in param_groups], {})

    def step(self, closure=None):
        raise NotImplementedError("this candidate never steps")


def raising(param_groups, **settings):
    return Raising(param_groups, **settings)
"""

TWO_BUGS = '''
from gates.examples.gathered_muon import _DECLARED, GatheredMuonMomentumRestart


class OneRowCrash(GatheredMuonMomentumRestart):
    """gathered_muon's arithmetic with its momentum restarted every step, plus a crash on 1-row weights."""

    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.shape[0] == 1:
                    raise IndexError(f"cannot take the rows of {tuple(p.shape)}")
        return super().step(closure)


def two_bugs(param_groups, **settings):
    return OneRowCrash(param_groups, **settings)


_DECLARED(two_bugs)
'''


DEV = ("--hypothesis-profile", "dev", "--hypothesis-seed", "0")


def _gates(other_project: pytest.Pytester, *args: str, profile: tuple[str, ...] = DEV) -> pytest.RunResult:
    """muongate's own gates from a directory that is not the repository, as another team runs them;
    by default 20 cases a gate, drawn from a fixed seed (``profile``)."""
    return run_pytest(
        other_project, "-p", "harness.plugin", "--pyargs", *args, "--nproc", "2", "-p", "no:randomly", "--gate-report", "report",
        *profile, timeout=900,
    )  # fmt: skip


def _report(project: pytest.Pytester) -> str:
    return (project.path / "report" / "equivalence.md").read_text()


@pytest.mark.slow
def test_a_candidate_that_raises_on_every_step_passes_no_gate(other_project: pytest.Pytester) -> None:
    other_project.makepyfile(raising=RAISING)
    result = _gates(other_project, "gates", "-m", "gate", "--impl", "raising:raising")
    outcomes = result.parseoutcomes()
    assert "passed" not in outcomes, result.stdout.str()[-4000:]
    assert outcomes["failed"] > 0 and outcomes["skipped"] > 0
    report = _report(other_project)
    # What judged muongate's own code was skipped and says so; nothing it ran counts for the candidate.
    for own in ("orthogonalizes_to_reference_rows", "catch_negative_control", "kernel_matches_reference"):
        assert own in report and "it runs without --impl" in report, own
    assert "muongate:" not in report.split("## Skipped")[0]


@pytest.mark.slow
def test_narrowed_gates_and_hand_picked_cases_are_skipped_naming_the_narrowing(other_project: pytest.Pytester) -> None:
    result = _gates(
        other_project, "gates.test_optimizer_gates", "-k", "hybrid or checkpoint or edge or one_step",
        "--impl", "examples.gathered_muon:gathered_muon", profile=("--hypothesis-profile", "ci"),
    )  # fmt: skip
    # (the ci profile: its first examples include cases narrowed for the candidate)
    # Its arithmetic differs from reference.Muon's by causes it declares: what ran passes within
    # them (one_step, six edge cases); what was narrowed away is skipped (two gates, six edge
    # cases, two need 4 ranks).
    result.assert_outcomes(passed=7, skipped=10)
    report = _report(other_project)
    for reason in (
        "hybrid_groups: not run: its claim is Muon and AdamW groups side by side, and "
        "examples.gathered_muon:gathered_muon does not declare adamw",
        "checkpoint: not run: its claim is a checkpoint round trip",
        "edge:experts-3x6x4: not run: narrowed for examples.gathered_muon:gathered_muon: w [3, 6, 4] → one expert",
        "edge:same-shape-stacks-fp32-ns: not run: narrowed for examples.gathered_muon:gathered_muon: ns_dtype "
        "float32 → bfloat16 (declared convention)",
    ):
        assert reason in report, reason
    one_step = next(line for line in report.splitlines() if line.startswith("| one_step |"))
    assert "narrowed)" in one_step, one_step


def test_a_convention_value_the_reference_cannot_take_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "half_muon.py").write_text(
        "from harness.candidates import Candidate\n"
        "@Candidate(conventions={'ns_dtype': 'float16'})\n"
        "def half_muon(param_groups, **settings):\n    raise AssertionError('never built')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    impl = Impl.load("half_muon:half_muon")
    with pytest.raises(UnsupportedConvention, match=r"ns_dtype.*must be torch\.bfloat16 or torch\.float32"):
        impl.adapt(Case(params=(ParamSpec("w", (4, 4)),), reference=reference.Muon))


@pytest.mark.slow
def test_self_reference_finds_a_sharding_bug_as_a_finding_of_its_own(other_project: pytest.Pytester) -> None:
    gate = ("gates.test_optimizer_gates", "-k", "one_step")
    buggy = ("--impl", "examples.gathered_muon:gathered_muon_local_lr")
    # Against the reference it differs by its declared causes everywhere, and the bug shows only
    # where it moves an update past their tier; against itself it is its own finding. Finding it is
    # a search: a tall matrix at two ranks, which the dev profile's 20 cases need not draw.
    against_self = _gates(other_project, *gate, *buggy, "--against", "self", profile=("--hypothesis-profile", "ci"))
    against_self.assert_outcomes(failed=1)
    against_self.stdout.fnmatch_lines_random(
        [
            "FAILED one_step: differs from itself*",
            "minimal case: w0[[]*] float32 · world 2 · *against itself on one device",
        ]
    )
    for correct in ("examples.gathered_muon:gathered_muon", None):
        impl = ("--impl", correct) if correct else ()
        passed = _gates(other_project, *gate, *impl, "--against", "self")
        passed.assert_outcomes(passed=1)
    # Both verdicts side by side: the correct but different candidate equals itself, not reference.Muon.
    row = next(line for line in _report(other_project).splitlines() if line.startswith("| one_step |"))
    assert "self 20/20" in row and "ref 20/20" in row, row


@pytest.mark.slow
def test_one_gate_reports_two_shrunk_findings_and_its_reproduce_command_fails_the_same_way(
    other_project: pytest.Pytester, rerun_reproduce: Any
) -> None:
    """A bug past the declared causes (the momentum restarted every step) and a crash on 1-row
    weights come out as two findings of one gate, each shrunk; the reproduce command, run from an
    empty directory, gives the same minimal cases."""
    other_project.makepyfile(two_bugs=TWO_BUGS)
    first = _gates(other_project, "gates.test_optimizer_gates", "-k", "several_steps", "--impl", "two_bugs:two_bugs")
    first.assert_outcomes(failed=1)
    first.stdout.fnmatch_lines_random(
        [
            "finding ? of 2: several_steps: error on rank 0: IndexError: cannot take the rows of (1, *",
            "finding ? of 2: several_steps: * tensor(s) lie past the tier of its declared causes*",
            "FAILED several_steps: error *",
            "FAILED several_steps: beyond its causes *",
        ]
    )
    minimal = [line for line in first.stdout.lines if line.startswith("minimal case:")]
    again = rerun_reproduce(first.stdout.str())
    assert again.returncode == 1, again.stdout[-3000:]
    for line in minimal:
        assert line in again.stdout.splitlines(), line


def test_minimal_case_names_every_field_that_differs_from_the_defaults() -> None:
    base = Case(params=(ParamSpec("w", (4, 4)),), reference=reference.Muon)
    changed: dict[str, Any] = {
        "seed": 3, "world_size": 2, "mesh": (2,), "steps": 2, "mode": "owner_split",
        "settings": (("weight_decay", 0.1),), "checkpoint_after": 1, "kernel": "k:f", "self_reference": True,
        "layout": layouts.OWN,
        "candidate": Impl, "reference": AdamW, "clip": Clip(1.0), "qk_clip": QKClip("w", "w", 2),
    }  # fmt: skip
    shown = {f.name for f in dataclasses.fields(Case) if f.compare} - {"params"}
    assert shown == set(changed), "a new Case field needs a place in describe()"
    for name, value in changed.items():
        assert dataclasses.replace(base, **{name: value}).describe() != base.describe(), name
    # a layout of more ranks shows in its degrees
    for layout, shown_as in ((layouts.FSDP_TP, "tp 2"), (layouts.EP_EFSDP, "ep 2"), (layouts.HSDP, "mesh [2, 2]")):
        on_four = dataclasses.replace(base, world_size=4, mesh=(2, 2), layout=layout)
        assert shown_as in on_four.describe().split(" · "), layout
    spec = base.params[0]
    params = {"dtype": "bfloat16", "use_muon": False, "grad": "zero", "grad_scale": 1e-8, "style": "rowwise"}
    assert set(params) == set(ParamSpec._fields) - {"name", "shape"}, (
        "a new ParamSpec field needs a place in describe()"
    )
    for name, value in params.items():
        other = dataclasses.replace(base, params=(spec._replace(**{name: value}),))
        assert other.describe() != base.describe(), name
    assert "grad_scale=1e-08" in dataclasses.replace(base, params=(spec._replace(grad_scale=1e-8),)).describe()


def test_a_planted_control_is_caught_by_a_difference_never_by_its_own_crash() -> None:
    from harness.cases import Case, ParamSpec
    from harness.ranks.context import CaseOutcome, RankFailure
    from harness.runner.ran import Ran, differed
    from reports.records import Comparison

    case = Case((ParamSpec("w0", (2, 2)),), world_size=2, mesh=(2,), reference=reference.Muon)
    ok, bad = Comparison("w0", (2, 2)), Comparison("w0", (2, 2), bitwise=False, passed=False, max_abs_diff=0.5)
    crash = RankFailure("error", 1, "RuntimeError: in-place on a view")
    assert differed(Ran(case, CaseOutcome([None, None], None, 1.0), (ok, bad))) is not None
    assert differed(Ran(case, CaseOutcome([None, None], None, 1.0), (ok,))) is None
    assert differed(Ran(case, CaseOutcome([None, None], crash, 1.0), (bad,))) is None
