"""What a gate calls: run a case on the ranks, write what happened, pass or fail with the verdict.

The runner is the only writer of the results stream (``reports.records`` holds every
kind it writes). Gates state claims: they choose cases, and where a gate reaches a
verdict itself (a singular-value band, finiteness) it hands the verdict to ``judge``.
A failure is reported as its verdict (figures, each failing rank's exit code and stack,
the case, the command that reproduces it), through ``pytest.fail(..., pytrace=False)``:
a traceback through the harness would say nothing about the candidate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, NoReturn, TypeVar

import pytest
import torch
from hypothesis import Phase, find, note, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.errors import NoSuchExample

from harness.algorithms import reference_of
from harness.candidates import Impl, Kernel, UnsupportedConvention
from harness.cases import Case, ReshardCase
from harness.cases.case import candidate_name
from harness.outcomes import HANG_DEADLINE_S, Classified, classify
from harness.ranks import CaseOutcome, LauncherGroup, RankContext, RankPool
from harness.reproduce import Rerun
from harness.tasks.kernel import run_kernel_case
from harness.tasks.optimizer import (
    run_backward_case,
    run_optimizer_case,
    run_orthogonalize_case,
    run_reshard_case,
    run_spectrum_case,
    run_update_case,
)
from harness.tasks.result import TaskResult
from harness.tasks.training import TrainingSpec, TwinsCase, run_training_case, run_training_twins, warm_up
from reports.records import (
    CaseResult,
    Comparison,
    Header,
    NegativeControl,
    Record,
    Scenario,
    Skip,
    Spectrum,
    Status,
    Training,
    finding_of,
)
from reports.stream import ResultStream
from reports.summary import GateSummary

T = TypeVar("T")


class AlreadyShrunk(BaseException):
    """A crash that another gate of this session has already shrunk. It ends the running test
    at once, failed, instead of shrinking the same crash again (every attempt costs a fresh
    pool). A ``BaseException`` so that hypothesis lets it through rather than shrinking it."""


class Finding(pytest.fail.Exception):  # type: ignore[misc,name-defined]
    """A failed gate, shown as its verdict alone (no traceback through the harness).

    One subclass per kind of finding (``FINDINGS``): hypothesis tells failures apart by
    their exception type, so a test that meets an arithmetic difference and a crash
    reports both, each shrunk to its own minimal case, instead of only the first."""

    def __init__(self, text: str) -> None:
        super().__init__(text, pytrace=False)


#: the kind of finding → its exception type: a case that differs from what it was judged
#: against (``reference.Muon``, or the candidate itself on one device) or a crash, by status
FINDINGS: dict[str, type[Finding]] = {
    kind: type(name, (Finding,), {"__doc__": f"A gate's finding: {kind}."})
    for kind, name in (
        ("differs from reference", "DiffersFromReference"),
        ("differs from itself", "DiffersFromItself"),
        ("failed", "VerdictFailed"),
        ("hang", "Hang"),
        ("collective mismatch", "CollectiveMismatch"),
        ("abort", "Abort"),
        ("error", "RankError"),
    )
}


def fail(text: str, kind: str = "failed") -> NoReturn:
    """Fails the running test with ``text`` alone, as a finding of ``kind`` (``FINDINGS``)."""
    __tracebackhide__ = True
    raise FINDINGS[kind](text)


@dataclass(frozen=True)
class Ran:
    """A case that ran: the pool's outcome, every rank's comparisons, and rank 0's figures."""

    case: Any
    outcome: CaseOutcome
    comparisons: tuple[Comparison, ...]
    figures: Mapping[str, Any] = field(default_factory=dict)

    @property
    def against(self) -> str:
        """What the case is judged against: ``self`` (the candidate on one device) or ``reference``."""
        return "self" if getattr(self.case, "self_reference", False) else "reference"

    @property
    def judged(self) -> tuple[Comparison, ...]:
        """The comparisons the verdict rests on (the others are shown beside it)."""
        return tuple(c for c in self.comparisons if c.against == self.against)

    @property
    def status(self) -> Status:
        if self.outcome.failure is not None:
            return self.outcome.failure.status
        return "passed" if self.message is None else "failed"

    @property
    def kind(self) -> str:
        """The kind of finding (``FINDINGS``) this case is, if it failed: the report's own
        name for it (``reports.records.finding_of``)."""
        return finding_of(self.status, self.comparisons)

    @property
    def message(self) -> str | None:
        """``None`` when the case passed; otherwise what went wrong, worst comparison first."""
        if self.outcome.failure is not None:
            return self.outcome.failure.describe()
        judged = self.judged
        if not judged:
            return "the case compared nothing"
        if all(c.all_zero or c.numel == 0 for c in judged):
            return "every comparison was of all-zero or empty tensors: the case compares nothing"
        bad = sorted((c for c in judged if not c.passed), key=lambda c: (-c.max_ulp, c.step, c.tensor))
        if not bad:
            return None
        what = "the candidate on one device" if self.against == "self" else reference_of(self.case).title
        lines = [f"{len(bad)} of {len(judged)} comparisons with {what} failed; worst first:"]
        lines += [f"  {c.line()}" for c in bad[:8]]
        return "\n".join(lines)


def robust_finding(ran: Ran) -> tuple[str | None, str]:
    """A robustness verdict: ``(None, why it passed)``, or the kind of finding and its message.
    An error that names a parameter of the case (quoted, as ``repr`` gives it) is a clear
    refusal and passes; any other error, a hang, an abort or a difference fails."""
    failure = ran.outcome.failure
    if failure is None:
        return (None, "") if ran.message is None else (ran.kind, ran.message)
    text = failure.describe()
    if failure.status != "error":
        return failure.status, text
    named = [p.name for p in ran.case.params if repr(p.name) in text or f'"{p.name}"' in text]
    if named:
        return None, f"refused with an error naming {named}: {failure.headline()}"
    return "error", f"{text}\nthe error names no parameter of the case"


@dataclass(repr=False)
class GateRunner:
    """Runs cases for gates; one per pytest session (see ``harness.plugin``)."""

    pool: RankPool | LauncherGroup
    stream: ResultStream
    launcher: bool = False
    nodeid: str = ""
    on_case: Callable[[str, bool], None] | None = None
    impl: Impl | None = None
    kernel: Kernel | None = None
    #: what optimizer cases are judged against: ``reference`` (``reference.Muon``) or ``self``
    against: str = "reference"
    #: the running test's file
    path: str = ""
    #: the session's options a reproduce command repeats (the plug-in fills it in)
    rerun: Rerun = field(default_factory=Rerun)
    #: whose code the running test judges (``begin`` sets it from the test's ``judges`` mark)
    subject: str = ""
    _cases: int = 0
    #: per test (node id): the figures of each gate it ran (``--junitxml`` carries them)
    figures: dict[str, dict[str, GateSummary]] = field(default_factory=dict)
    #: crash signature → (gate, minimal case, node id) of the test that shrank it
    shrunk: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    _last_crash: dict[str, tuple[str, str, str]] = field(default_factory=dict)

    #: tasks whose model the harness lays out with ``fully_shard`` (not a candidate's own ``shard``)
    TASKS_OF_MODELS: ClassVar = ("backward", "training", "twins")
    TASKS: ClassVar[dict[str, Callable[[RankContext, Any], TaskResult]]] = {
        "optimizer": run_optimizer_case,
        "orthogonalize": run_orthogonalize_case,
        "backward": run_backward_case,
        "spectrum": run_spectrum_case,
        "reshard": run_reshard_case,
        "update": run_update_case,
        "training": run_training_case,
        "twins": run_training_twins,
        "kernel": run_kernel_case,
    }

    # -- writing -----------------------------------------------------------------------
    def write(self, record: Record, *, sync: bool = True) -> None:
        self.stream.write(record, sync=sync)

    def start(self, header: Header) -> None:
        self.write(header)

    def skip(self, gate: str, reason: str) -> None:
        self.write(Skip(gate, reason))

    def begin(self, nodeid: str, path: str = "", subject: str = "candidate") -> None:
        """A test starts (``path``: its file): what it writes is filed under it, as a verdict
        on ``subject`` (the candidate, which the header names, unless the test is marked ``judges``)."""
        self.nodeid = nodeid
        self.path = path
        self.subject = subject

    def reference_only(self, gate: str) -> None:
        """Skips the running test under ``--against self``: it can only compare with ``reference.Muon``."""
        if self.against == "self":
            pytest.skip(f"{gate}: compares with reference.Muon only; --against self judges the optimizer gates")

    @property
    def device(self) -> str:
        """Rank 0's device (``cpu``, ``cuda:0``)."""
        return str((getattr(self.pool, "devices", None) or [getattr(self.pool, "device", "cpu")])[0])

    def _runnable(self, gate: str) -> None:
        """Skips the running test, naming the gate, when the candidate declared conventions the
        reference cannot express, or the ranks' device type is not one it declared."""
        if self.impl is not None and self.impl.inexpressible:
            reasons = "; ".join(self.impl.inexpressible)
            pytest.skip(
                f"{gate}: not run: {self.impl.spec} declares conventions the reference cannot express: {reasons}"
            )
        kind = torch.device(self.device).type
        self.require(gate, {kind}, f"its ranks run on {kind}")

    def algorithm_claim(self, gate: str, about: str) -> None:
        """Skips the running test unless the session's reference is Muon: its claim is about ``about``."""
        from harness.session import gate_config

        algorithm = gate_config().algorithm
        if algorithm is not None and not algorithm.orthogonalizes:
            pytest.skip(f"{gate}: a claim of Muon's ({about}); the session's reference is {algorithm.title}")

    def require(self, gate: str, features: set[str], why: str) -> None:
        """Skips the running test when the candidate did not declare what its claim is about."""
        missing = self.impl.missing(features) if self.impl else []
        if missing:
            assert self.impl is not None
            shown = ", ".join("more than one rank" if m == "world" else m for m in missing)
            pytest.skip(f"{gate}: not run: {why}, and {self.impl.spec} does not declare {shown}")

    def _record(
        self, gate: str, described: str, status: Status, message: str, seconds: float, *, case: Any = None, **kw: Any
    ) -> None:
        self._cases += 1
        failed = status != "passed"
        record = CaseResult(
            self._cases, gate, described, status, message, round(seconds, 4),
            self.reproduce_command() if failed else "", judged=self._judged(case),
            narrowed=tuple(getattr(case, "narrowed", ())), layout=getattr(case, "layout", ""), **kw,
        )  # fmt: skip
        self.write(record)
        self.figures.setdefault(self.nodeid, {}).setdefault(gate, GateSummary(gate)).add(record)
        if self.on_case is not None:
            self.on_case(gate, not failed)

    # -- running -----------------------------------------------------------------------
    def run(
        self,
        case: Any,
        *,
        task: str = "optimizer",
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Ran:
        """Runs the case on its ranks and returns what happened; writes nothing.

        With ``--impl``, a case meant for the built-in candidate goes to the plug-in instead,
        narrowed to what it declared it supports (the gate skips, saying why, where it
        cannot). With ``--against self``, an optimizer case also runs the candidate on one
        device and is judged against that."""
        drawn, case = case, self._resolve(case)
        if self.against == "self" and task in ("optimizer", "backward") and isinstance(case, Case):
            case = replace(case, self_reference=True)
        if case != drawn and currently_in_test_context():
            # Hypothesis's "Falsifying example" shows the case as drawn; say how it ran.
            note(f"as it ran (adapted to the candidate and the run's options): {case!r}")
        world = getattr(case, "world_size", 1)
        if world > self.pool.nproc:
            raise ValueError(f"{case.describe()} needs {world} ranks; the pool has --nproc {self.pool.nproc}")
        if isinstance(self.pool, RankPool):
            outcome = self.pool.run(self.TASKS[task], case, world_size=world, timeout_s=timeout_s, env=env)
        else:
            outcome = self.pool.run(self.TASKS[task], case, world_size=world)
        results = [r for r in outcome.results if isinstance(r, TaskResult)]
        comparisons = tuple(c for r in results for c in r.comparisons)
        figures = outcome.results[0].figures if isinstance(outcome.results[0], TaskResult) else {}
        return Ran(case, outcome, comparisons, figures)

    def check(self, gate: str, case: Any, *, task: str = "optimizer", exact: bool = False) -> Ran:
        """Runs the case and writes it with its verdict; fails the test unless every comparison passed.

        ``exact``: a hand-picked case, whose point any narrowing for the candidate removes;
        narrowed, it is skipped with the narrowing named instead of run."""
        __tracebackhide__ = True
        self._runnable(gate)
        if task in self.TASKS_OF_MODELS:
            self.require(gate, {"fully_shard"}, "its model is laid out by FSDP2's fully_shard")
        if exact and self.impl is not None and isinstance(case, Case):
            narrowed = [*self._resolve(case).narrowed, *self.impl.overridden(case)]
            if narrowed:
                pytest.skip(f"{gate}: not run: narrowed for {self.impl.spec}: {'; '.join(narrowed)}")
        return self._verdict(gate, self.run(case, task=task))

    def _verdict(self, gate: str, ran: Ran) -> Ran:
        """Writes a case that ran with its verdict; fails the test unless every comparison passed."""
        __tracebackhide__ = True
        message = ran.message
        described = ran.case.describe()
        failure = ran.outcome.failure
        if failure is not None:
            signature = failure.signature
            self._last_crash[self.nodeid] = (signature, gate, described)
            earlier = self.shrunk.get(signature)
            if earlier is not None and earlier[2] != self.nodeid:
                message = (
                    f"{message}\nnot shrunk again: gate {earlier[0]} already showed the same {failure.status} "
                    f"on: {earlier[1]}"
                )
                self._record(
                    gate,
                    described,
                    ran.status,
                    message,
                    ran.outcome.seconds,
                    case=ran.case,
                    comparisons=ran.comparisons,
                )
                raise AlreadyShrunk(self._failure(gate, message, described))
        self._record(
            gate, described, ran.status, message or "", ran.outcome.seconds, case=ran.case, comparisons=ran.comparisons
        )
        if message is not None:
            fail(self._failure(gate, message, described), ran.kind)
        return ran

    def withstands(self, gate: str, case: Case) -> Ran:
        """A robustness case: it passes if the candidate computes the reference, or refuses the
        input with an error that names the parameter (quoted, as ``repr`` gives it) on the
        ranks that fail; a hang, an abort, another error, or a silent difference fails it."""
        __tracebackhide__ = True
        self._runnable(gate)
        ran = self.run(case)
        failure = ran.outcome.failure
        if failure is None or failure.status != "error":
            return self._verdict(gate, ran)
        kind, message = robust_finding(ran)
        self._record(
            gate, ran.case.describe(), ran.status if kind else "passed", message, ran.outcome.seconds, case=ran.case
        )
        if kind is not None:
            fail(self._failure(gate, message, ran.case.describe()), kind)
        return ran

    def finished(self, nodeid: str, failed: bool) -> None:
        """A test ended: the crash its minimal case showed (hypothesis replays that one last)
        counts as shrunk for the rest of the session."""
        crash = self._last_crash.pop(nodeid, None)
        if failed and crash is not None:
            signature, gate, described = crash
            self.shrunk.setdefault(signature, (gate, described, nodeid))

    def measured(self, gate: str, case: Any, *, task: str) -> Ran:
        """Runs a case whose verdict the gate reaches itself (see ``judge``); a rank that
        failed is written and fails the test here."""
        __tracebackhide__ = True
        ran = self.run(case, task=task)
        failure = ran.outcome.failure
        if failure is not None:
            described = ran.case.describe()
            self._record(gate, described, ran.status, failure.describe(), ran.outcome.seconds, case=ran.case)
            fail(self._failure(gate, failure.describe(), described), ran.kind)
        return ran

    def judge(
        self,
        gate: str,
        described: str,
        passed: bool,
        message: str,
        *,
        tier: str,
        comparisons: Sequence[Comparison] = (),
        figures: Mapping[str, float] | None = None,
        spectrum: Mapping[str, Any] | None = None,
        seconds: float = 0.0,
    ) -> None:
        """A verdict the gate reached itself (a band, finiteness): written, and a failure unless
        ``passed``. ``spectrum`` (``shape``, ``dtype``, ``singular_values``, ``band``) is drawn in the report."""
        __tracebackhide__ = True
        if spectrum is not None:
            self.write(
                Spectrum(
                    gate,
                    tuple(spectrum["shape"]),
                    str(spectrum["dtype"]),
                    tuple(spectrum["singular_values"]),
                    tuple(spectrum["band"]),  # type: ignore[arg-type]
                ),
                sync=False,
            )
        status: Status = "passed" if passed else "failed"
        self._record(
            gate,
            described,
            status,
            message,
            0.0,
            tier=tier,
            comparisons=tuple(comparisons),
            figures=dict(figures or {}),
        )
        if not passed:
            fail(self._failure(gate, message, described))

    def catch(
        self,
        gate: str,
        strategy: st.SearchStrategy[T],
        caught: Callable[[T], str | None],
        describe: Callable[[T], str],
        *,
        max_examples: int = 300,
    ) -> T:
        """A negative control: searches ``strategy`` for an example ``caught`` rejects (its
        reason, or ``None``), shrinks it, writes whether the minimal example is caught, and
        returns that example. The test fails unless it is caught."""
        __tracebackhide__ = True
        try:
            minimal = find(
                strategy,
                lambda x: caught(x) is not None,
                settings=settings(
                    max_examples=max_examples, database=None, derandomize=True, phases=[Phase.generate, Phase.shrink]
                ),
            )
        except NoSuchExample:
            record = NegativeControl(gate, False, f"none of {max_examples} examples", "the gates passed every one")
            self.write(record)
            fail(f"{gate}: the gates passed a known-wrong variant on all {max_examples} examples tried")
        message = caught(minimal)
        record = NegativeControl(gate, message is not None, describe(minimal), message or "")
        self.write(record)
        if not record.detected:
            fail(f"{gate} was not detected on its own minimal example {record.case}")
        return minimal

    def train(self, gate: str, spec: TrainingSpec) -> Mapping[str, Any]:
        """Runs a training gate (fails like ``check``) and writes its loss curve for the report.

        Returns rank 0's figures: ``train_bits`` (mean per-rank training loss at each step, in
        bits per byte) and ``held_out_bits`` (before and after training)."""
        __tracebackhide__ = True
        ran = self.check(gate, spec, task="training")
        self.write(
            Training(
                gate,
                ran.case.describe(),
                ran.case.world_size,
                tuple(ran.figures.get("train_bits", ())),
                tuple(ran.figures.get("held_out_bits", ())),
                round(ran.outcome.seconds, 4),
            )
        )
        return ran.figures

    def reproduce(self, gate: str, case: Any, *, env: dict[str, str] | None = None) -> Classified:
        """Runs an MoE scenario that may hang, abort or corrupt, and writes what it did.

        Needs the pool: only the pool can kill a hung rank and start fresh ones. A hang is
        whatever is still running ``HANG_DEADLINE_S`` after the start; ``env`` (e.g.
        ``TORCH_DISTRIBUTED_DEBUG=DETAIL``) applies to fresh ranks for this run.

        The fixed model does one forward and backward first, under the ordinary case
        timeout: fresh ranks spend seconds on their first FSDP2 step (about 5 s on a GPU),
        which must not count against the naive run's deadline.
        """
        __tracebackhide__ = True
        if self.launcher or not isinstance(self.pool, RankPool):
            pytest.skip("reproducing a hang or an abort needs the rank pool: torchrun cannot replace a lost rank")
        warm = self.pool.run(warm_up, case.with_variant("fixed"), world_size=case.world_size, env=env)
        if warm.failure is not None:
            fail(f"the fixed model failed, so the naive one proves nothing: {warm.failure.describe()}")
        ran = self.run(case, task="training", timeout_s=HANG_DEADLINE_S, env=env)
        verdict = classify(ran.outcome, ran.comparisons)
        self.write(
            Scenario(
                gate,
                case.name,
                case.wrapping,
                case.variant,
                verdict.outcome,
                case=case.describe(),
                detail=verdict.detail,
                no_tokens=tuple(case.empty),
                env=dict(env or {}),
                collectives=verdict.collectives,
                seconds=round(ran.outcome.seconds, 4),
            )
        )
        if self.on_case is not None:
            self.on_case(gate, True)
        return verdict

    # -- helpers -------------------------------------------------------------------------
    def reproduce_command(self) -> str:
        """The command that reruns the running test from any directory (``harness.reproduce``)."""
        if not self.nodeid:
            return ""
        return replace(
            self.rerun,
            nproc=self.pool.nproc,
            launcher=self.launcher,
            impl=self.impl.spec if self.impl else None,
            kernel=self.kernel.spec if self.kernel else None,
            against=self.against,
        ).command(self.path, self.nodeid.partition("::")[2])

    def _failure(self, gate: str, message: str, described: str) -> str:
        command = self.reproduce_command()
        return f"{gate}: {message}\nminimal case: {described}" + (f"\nreproduce: {command}" if command else "")

    def __repr__(self) -> str:  # hypothesis prints it in every failing example
        return (
            f"GateRunner(nproc={self.pool.nproc}, impl={self.impl.spec if self.impl else None!r}, "
            f"kernel={self.kernel.spec if self.kernel else None!r})"
        )

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # hypothesis's pretty printer asks for this
        printer.text(repr(self))

    def _judged(self, case: Any) -> str:
        """What a case judged: the test's subject, or the candidate the case itself carries
        (a planted control) where that is not the session's."""
        own = getattr(case, "candidate", None)
        if own is None or (self.impl is not None and own is self.impl.factory):
            return self.subject
        return candidate_name(own).rpartition(":")[2]

    def _resolve_reshard(self, case: ReshardCase) -> ReshardCase:
        """Both sides of a resharding case on the candidate; skipped where either is narrowed."""
        assert self.impl is not None
        try:
            sides = [self.impl.adapt(c, self.pool.nproc) for c in (case.before, case.after)]
        except UnsupportedConvention as e:
            pytest.skip(str(e))
        narrowed = [n for side in sides for n in side.narrowed]
        if narrowed:
            pytest.skip(f"reshard: not run: narrowed for {self.impl.spec}: {'; '.join(narrowed)}")
        return replace(case, before=sides[0], after=sides[1])

    def _resolve(self, case: Any) -> Any:
        if self.kernel is not None and isinstance(case, Case) and case.kernel is None:
            case = replace(case, kernel=self.kernel.spec)
        if self.impl is None or getattr(case, "candidate", ...) is not None:
            return case
        if isinstance(case, Case) and case.kernel:
            pytest.skip(f"{self.impl.spec} brings its own Newton–Schulz: kernel gates run ShardedMuon only")
        if isinstance(case, ReshardCase):
            return self._resolve_reshard(case)
        if isinstance(case, TwinsCase):
            try:
                return replace(case, spec=self.impl.adapt_training(case.spec))
            except UnsupportedConvention as e:
                pytest.skip(str(e))
        try:
            return self.impl.adapt(case, self.pool.nproc) if isinstance(case, Case) else self.impl.adapt_training(case)
        except UnsupportedConvention as e:
            pytest.skip(str(e))
