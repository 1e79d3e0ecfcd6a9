"""``GateRunner``: the one object a gate holds (the ``gate_runner`` fixture), putting the
runner's jobs together: adapt the drawn case (``adapt``), run it (``dispatch``), reach and
write its verdict (``ran``, ``record``), skip what cannot run (``policy``), remember crashes
already shrunk (``findings``), search negative controls (``controls``), and the training
and MoE scenarios (``scenarios``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from harness.candidates import Impl, Kernel
from harness.cases import Case, ReshardCase
from harness.cases.case import candidate_name
from harness.ranks import LauncherGroup, RankPool
from harness.reproduce import Rerun
from harness.runner import controls, scenarios
from harness.runner.adapt import Adaptation
from harness.runner.dispatch import run_on
from harness.runner.findings import AlreadyShrunk, ShrinkMemory, fail
from harness.runner.policy import TASKS_OF_MODELS, SkipPolicy
from harness.runner.ran import Ran, RankCase, robust_finding
from harness.runner.record import Recorder
from harness.runner.routing import judge_routes
from harness.tasks.common import declared_causes
from harness.tasks.training import TrainingSpec
from harness.verdicts.causes import BEYOND, judge_causes
from harness.verdicts.outcomes import Classified
from reports.records import (
    BEYOND_CAUSES,
    CAUSE_REACH,
    GREEN,
    NOT_FAILED,
    Comparison,
    Header,
    Record,
    Routing,
    Spectrum,
    Status,
)
from reports.stream import ResultStream
from reports.summary import GateSummary

T = TypeVar("T")


@dataclass(repr=False)
class GateRunner:
    """Runs cases for gates; one per pytest session (see ``harness.plugin``)."""

    pool: RankPool | LauncherGroup
    stream: ResultStream
    launcher: bool = False
    on_case: Callable[[str, bool], None] | None = None
    impl: Impl | None = None
    kernel: Kernel | None = None
    #: what optimizer cases are judged against: ``reference`` or ``self`` (the candidate on one device)
    against: str = "reference"
    #: the session's options a reproduce command repeats (the plug-in fills it in)
    rerun: Rerun = field(default_factory=Rerun)
    #: the family the session judges against (``harness.algorithms.Algorithm``), which the plug-in
    #: resolves before it makes the runner; a case that names no candidate runs the family's built-in
    algorithm: Any = None
    #: the running test (node id) and its file; whose code it judges (``begin``)
    nodeid: str = ""
    path: str = ""
    subject: str = ""
    shrinks: ShrinkMemory = field(default_factory=ShrinkMemory)

    def __post_init__(self) -> None:
        self.recorder = Recorder(self.stream, self.on_case)
        self._judge(self.impl)
        #: the running test's passed cases, by gate, task and the case's pickle (``_once``)
        self._passed: dict[tuple[str, str, bytes], Ran] = {}
        #: the first line of each crash since the running negative control began (``catch``)
        self._crashes: list[str] = []

    def _judge(self, impl: Impl | None) -> None:
        """The candidate the running test adapts its cases to and skips for."""
        self.policy = SkipPolicy(impl, self.against, self.device, self.algorithm)
        self.adapt = Adaptation(impl, self.kernel, self.against, self.pool.nproc)

    # -- the session and its tests ---------------------------------------------------------
    @property
    def figures(self) -> dict[str, dict[str, GateSummary]]:
        """Per test (node id): the figures of each gate it ran (``--junitxml`` carries them)."""
        return self.recorder.figures

    @property
    def device(self) -> str:
        """Rank 0's device (``cpu``, ``cuda:0``)."""
        return str((getattr(self.pool, "devices", None) or [getattr(self.pool, "device", "cpu")])[0])

    def write(self, record: Record, *, sync: bool = True) -> None:
        self.recorder.write(record, sync=sync)

    def start(self, header: Header) -> None:
        self.write(header)

    def skip(self, gate: str, reason: str) -> None:
        self.recorder.skip(gate, reason)

    def begin(self, nodeid: str, path: str = "", subject: str = "candidate") -> None:
        """A test starts (``path``: its file): what it writes is filed under it, as a verdict
        on ``subject`` (the candidate, which the header names, unless the test is marked ``judges``)."""
        self.nodeid, self.path, self.subject = nodeid, path, subject
        self._judge(self.impl)
        self._passed.clear()

    def finished(self, nodeid: str, failed: bool) -> None:
        """A test ended (``ShrinkMemory.finished``)."""
        self.shrinks.finished(nodeid, failed)

    # -- what skips ------------------------------------------------------------------------
    def reference_only(self, gate: str) -> None:
        self.policy.reference_only(gate)

    def require(self, gate: str, features: set[str], why: str) -> None:
        self.policy.require(gate, features, why)
        if self.impl is not None and self.impl.probed:
            self._judge(self.impl.probing_only(features))

    def algorithm_claim(self, gate: str, about: str) -> None:
        self.policy.algorithm_claim(gate, about)

    def declares(self, gate: str, field: str, what: str) -> None:
        self.policy.declares(gate, field, what)

    # -- running and judging ---------------------------------------------------------------
    def run(
        self,
        case: Any,
        *,
        task: str = "optimizer",
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Ran:
        """Runs the case, as adapted to the session (``Adaptation``), on its ranks; writes nothing."""
        drawn, case = case, self.adapt(case, task)
        if case != drawn and currently_in_test_context():
            # Hypothesis's "Falsifying example" shows the case as drawn; say how it ran.
            note(f"as it ran (adapted to the candidate and the run's options): {case!r}")
        ran = run_on(self.pool, case, task, timeout_s=timeout_s, env=env)
        if ran.outcome.failure is not None:
            self._crashes.append(ran.outcome.failure.headline())
        return ran

    def check(self, gate: str, case: Any, *, task: str = "optimizer", exact: bool = False) -> Ran:
        """Runs the case and writes it with its verdict; fails the test unless every comparison passed.

        ``exact``: a hand-picked case, whose point any narrowing for the candidate removes;
        narrowed, it is skipped with the narrowing named instead of run."""
        __tracebackhide__ = True
        self.policy.runnable(gate, task)
        if exact and isinstance(case, Case):
            self.policy.exact(gate, self.adapt.narrowed(case))
        return self._once(
            gate,
            task,
            case,
            lambda: self._verdict(gate, self.run(case, task=task), calibrated=task not in TASKS_OF_MODELS),
        )

    def withstands(self, gate: str, case: Case) -> Ran:
        """A robustness case: it passes if the candidate computes the reference, or refuses the
        input with an error that names the parameter (``robust_finding``); a hang, an abort,
        another error, or a silent difference fails it."""
        __tracebackhide__ = True
        self.policy.runnable(gate)
        return self._once(gate, "robust", case, lambda: self._verdict(gate, self.run(case), robust=True))

    def _once(self, gate: str, task: str, case: Any, judged: Callable[[], Ran]) -> Ran:
        """``judged()``, unless the running test's ``gate`` already passed a case equal to ``case``
        (by its pickle, what the ranks receive): hypothesis remembers the choices it tried, not
        the values they drew, and of the ``ci`` profile's 200 examples a gate draws up to 35
        equal to an earlier one. A case's run is deterministic, so its verdict is the one
        written; it is not run, written or counted again. A failed case is run each time
        hypothesis asks (its shrinking and its flakiness check see every run)."""
        pickled = controls.pickled(case)
        if pickled is None:  # nothing to key on: judge it
            return judged()
        key = (gate, task, pickled)
        if key not in self._passed:
            self._passed[key] = judged()
        return self._passed[key]

    def measured(self, gate: str, case: Any, *, task: str) -> Ran:
        """Runs a case whose verdict the gate reaches itself (see ``judge``); a rank that
        failed is written and fails the test here."""
        __tracebackhide__ = True
        ran = self.run(case, task=task)
        failure = ran.outcome.failure
        if failure is not None:
            self._record(gate, ran.case, ran.status, failure.describe(), ran.outcome.seconds)
            fail(self._failure(gate, failure.describe(), ran.case.describe()), ran.kind)
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
        status: Status | None = None,
    ) -> None:
        """A verdict the gate reached itself (a band, finiteness): written, and a failure unless
        ``passed``. ``spectrum`` (``shape``, ``dtype``, ``singular_values``, ``band``) is drawn in the report.
        ``status``: another than ``passed`` or ``failed`` (``not judged``)."""
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
        status = status or ("passed" if passed else "failed")
        self._record(
            gate, None, status, message, seconds, described=described, tier=tier,
            comparisons=tuple(comparisons), figures=dict(figures or {}),
        )  # fmt: skip
        if status not in NOT_FAILED:
            fail(self._failure(gate, message, described))

    def route(self, gate: str, case: Case, *, table: bool = False) -> Ran:
        """The routing audit of a case (``harness.runner.routing``): which algorithm stepped each
        parameter, by its first step (or its state where the step cannot tell), on every rank; red where one stepped as
        another than declared. ``table``: the report lists its parameters (a ``Routing`` record)."""
        __tracebackhide__ = True
        self.policy.runnable(gate)
        ran = self.measured(gate, case, task="routing")
        rows, status, message = judge_routes(ran.routes)
        described = ran.case.describe()
        if table:
            ran_case = cast(Case, ran.case)
            steps = f"{ran_case.steps} step{'s' if ran_case.steps > 1 else ''}"
            layout = f"world {ran_case.world_size}, {ran_case.layout.title}, {steps}"
            self.write(Routing(gate, layout, self._judged(ran.case), rows), sync=False)
        self.judge(gate, described, status == "passed", message, tier="routing", status=status,
                   seconds=ran.outcome.seconds)  # fmt: skip
        return ran

    def catch(
        self,
        gate: str,
        strategy: st.SearchStrategy[T],
        caught: Callable[[T], str | None],
        describe: Callable[[T], str],
        *,
        max_examples: int = 300,
    ) -> T:
        """A negative control (``controls.search``): the minimal example the gates reject; the
        test fails unless one is found and caught, saying how many examples ended before
        comparing anything (a control whose every case errors judged nothing)."""
        __tracebackhide__ = True
        self._crashes.clear()
        return controls.search(
            self.recorder, gate, strategy, caught, describe, max_examples=max_examples, crashes=self._crashes
        )

    def train(self, gate: str, spec: TrainingSpec) -> Mapping[str, Any]:
        """A training gate (``scenarios.train``)."""
        __tracebackhide__ = True
        return scenarios.train(self, gate, spec)

    def reproduce(self, gate: str, case: Any, *, env: dict[str, str] | None = None) -> Classified:
        """An MoE scenario that may hang, abort or corrupt (``scenarios.reproduce``)."""
        __tracebackhide__ = True
        return scenarios.reproduce(self, gate, case, env=env)

    # -- verdicts --------------------------------------------------------------------------
    def _verdict(self, gate: str, ran: Ran, *, robust: bool = False, calibrated: bool = True) -> Ran:
        """Writes a case that ran with its verdict; fails the test unless every comparison passed
        (``robust``: or the candidate refused the input by name, ``robust_finding``). A crash
        another test already shrank ends this one at once (``AlreadyShrunk``)."""
        __tracebackhide__ = True
        message, kind, status = ran.message, ran.kind, ran.status
        failure = ran.outcome.failure
        if robust and failure is not None and failure.status == "error":
            found, message = robust_finding(ran)
            kind, status = found or kind, status if found else "passed"
        figures: dict[str, float] = {}
        case = _judged_case(ran.case)
        if status == "failed" and case is not None and _bitwise_failures(ran) and (causes := declared_causes(case)):
            status, kind, message, figures = self._by_causes(
                ran, case, causes, kind, message or "", calibrated=calibrated
            )
        described = ran.case.describe()
        failed = status not in NOT_FAILED
        earlier = None
        if failed and failure is not None:
            earlier = self.shrinks.met(self.nodeid, failure.signature, gate, described)
            if earlier is not None:
                message = (
                    f"{message}\nnot shrunk again: gate {earlier[0]} already showed the same {failure.status} "
                    f"on: {earlier[1]}"
                )
        self._record(
            gate, ran.case, status, message or "", ran.outcome.seconds, comparisons=ran.comparisons, figures=figures,
            against=ran.against,
        )  # fmt: skip
        if earlier is not None:
            raise AlreadyShrunk(self._failure(gate, message or "", described))
        if failed:
            fail(self._failure(gate, message or "", described), kind)
        return ran

    def _by_causes(
        self, ran: Ran, case: Case, causes: frozenset[str], kind: str, message: str, *, calibrated: bool
    ) -> tuple[Status, str, str, dict[str, float]]:
        """A failed case of a candidate that declares causes, judged by them (``judge_causes``):
        red where a tensor lies past their tier or differs where they cannot reach; green
        (``within causes``) where every difference was judged within their tier, or some were and
        the rest no tier can judge (each named); ``not judged`` where none could be judged."""
        verdict = judge_causes(causes, case, ran.judged, self.device, calibrated=calibrated, against=ran.against)
        named = "+".join(sorted(causes))
        unjudged = [f"  not judged: {line}" for line in verdict.unjudged]
        if verdict.past or verdict.unexplained:
            lines = []
            if verdict.past:
                kind = "beyond its causes"
                far = f", {verdict.far} of them over {BEYOND:g} × past it" if verdict.far else ""
                lines.append(f"{len(verdict.past)} tensor(s) lie past the tier of its declared causes ({named}){far}:")
                lines += [f"  {line}" for line in verdict.past]
            if verdict.unexplained:
                lines.append(f"{len(verdict.unexplained)} tensor(s) differ where its declared causes cannot reach:")
                lines += [f"  {line}" for line in verdict.unexplained]
            figures = {BEYOND_CAUSES: float(len(verdict.past))} if verdict.past else {}
            return "failed", kind, "\n".join([*lines, message]), figures
        if verdict.within:
            head = (
                f"within its declared causes ({named}): every difference judged lies inside their calibrated tier, "
                f"the worst at {verdict.reach:.2g} of it"
            )
            lines = [head, *(f"  {line}" for line in verdict.within), *unjudged]
            return "within causes", kind, "\n".join([*lines, message]), {CAUSE_REACH: verdict.reach}
        head = f"differs only where no tier of its declared causes ({named}) can judge:"
        return "not judged", kind, "\n".join([head, *unjudged, message]), {}

    def _record(
        self, gate: str, case: RankCase | None, status: Status, message: str, seconds: float, *,
        described: str = "", **kw: Any,
    ) -> None:  # fmt: skip
        self.recorder.case(
            self.nodeid, gate, described or (case.describe() if case is not None else ""), status, message, seconds,
            reproduce=self.reproduce_command() if status not in GREEN else "", judged=self._judged(case),
            case=case, **kw,
        )  # fmt: skip

    def _judged(self, case: Any) -> str:
        """What a case judged: the test's subject, or the candidate the case itself carries
        (a planted control) where that is not the session's."""
        own = getattr(case, "candidate", None)
        if own is None or (self.impl is not None and own is self.impl.factory):
            return self.subject
        return candidate_name(own, None).rpartition(":")[2]

    # -- reproducing -----------------------------------------------------------------------
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


def _bitwise_failures(ran: Ran) -> bool:
    """Whether what failed the case were bitwise comparisons, the ones a declared cause may
    explain; a comparison that failed a tier of its own (the cause gate's) is that tier's verdict."""
    failed = [c for c in ran.judged if not c.passed]
    return bool(failed) and all(c.tier_kind == "bitwise" for c in failed)


def _judged_case(case: Any) -> Case | None:
    """The ``Case`` whose parameters and settings a ran case's comparisons are of: itself, or a
    resharding case's second phase (the same parameters, seed, settings and steps)."""
    if isinstance(case, ReshardCase):
        return case.after
    return case if isinstance(case, Case) else None
