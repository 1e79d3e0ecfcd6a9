"""What a gate calls: run a case on the pool, stream every record, return or raise the verdict."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import pytest

from harness.cases import DEFAULT_CANDIDATE, Case
from harness.kernels import Kernel, KernelCase, run_kernel_case
from harness.launcher import LauncherGroup
from harness.moe import HANG_DEADLINE_S, Classified, MoECase, classify
from harness.plugins import Impl, UnsupportedConvention
from harness.pool import CaseOutcome, RankContext, RankPool
from harness.tasks import run_backward_case, run_optimizer_case, run_orthogonalize_case
from harness.training import TrainingSpec, run_training_case, warm_up
from reports.stream import ResultStream


class GateFailure(AssertionError):
    """A case that did not reproduce the reference (or a rank that failed while trying)."""


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

    TASKS: ClassVar[dict[str, Callable[[RankContext, Any], Any]]] = {
        "optimizer": run_optimizer_case,
        "orthogonalize": run_orthogonalize_case,
        "backward": run_backward_case,
        "training": run_training_case,
    }

    def outcome(
        self, gate: str, case: Case | TrainingSpec, *, record: bool = True, task: str = "optimizer"
    ) -> tuple[CaseOutcome, list[dict[str, Any]]]:
        """Runs the case and (with ``record``) streams its records; returns the outcome and records.

        With ``--impl``, a case meant for the built-in candidate goes to the plug-in instead,
        narrowed to what it declared it supports.
        """
        case = self._resolve(case)
        if case.world_size > self.pool.nproc:
            raise ValueError(f"{case.describe()} needs {case.world_size} ranks; the pool has --nproc {self.pool.nproc}")
        outcome = self.pool.run(self.TASKS[task], (gate, case), world_size=case.world_size)
        records = comparison_records(outcome)
        described = case.describe()
        for r in records if record else ():
            self.stream.write({"kind": "comparison", **r, "case": described, "case_seconds": outcome.seconds})
        return outcome, records

    def check(self, gate: str, case: Case | TrainingSpec, *, task: str = "optimizer") -> CaseOutcome:
        """Runs the case; raises ``GateFailure`` with the failing figures unless every comparison passed.

        Returns the outcome: each rank's result, as the task returned it."""
        case = self._resolve(case)
        outcome, records = self.outcome(gate, case, task=task)
        message = verdict_message(case, outcome, records)
        self.stream.write(
            {
                "kind": "case",
                "gate": gate,
                "case": case.describe(),
                "passed": message is None,
                "message": message or "",
                "seconds": outcome.seconds,
                "reproduce": reproduce_command(self.nodeid, self.pool.nproc, self.launcher),
            },
            sync=True,
        )
        if self.on_case is not None:
            self.on_case(gate, message is None)
        if message is not None:
            raise GateFailure(f"{message}\n{case.describe()}")
        return outcome

    def kernel_case(self, gate: str, case: KernelCase, *, record: bool = True) -> dict[str, Any]:
        """Runs a kernel against the reference Newton–Schulz on rank 0's device; returns rank 0's figures.

        With ``record``, the comparison goes to the stream (the verdict is the gate's)."""
        outcome = self.pool.run(run_kernel_case, (gate, case), world_size=1)
        if outcome.failure is not None:
            raise GateFailure(f"{outcome.failure.describe()}\n{case.describe()}")
        figures: dict[str, Any] = outcome.results[0]
        if record:
            self.stream.write({"kind": "comparison", **figures["record"], "case": case.describe()})
        return figures

    def record_case(self, gate: str, case: str, passed: bool, message: str, **figures: Any) -> None:
        """A verdict the gate itself reached (kernel, oracle and edge-input gates)."""
        self.stream.write(
            {"kind": "case", "gate": gate, "case": case, "passed": passed, "message": message, "seconds": 0.0,
             "reproduce": reproduce_command(self.nodeid, self.pool.nproc, self.launcher), **figures},
            sync=True,
        )  # fmt: skip
        if self.on_case is not None:
            self.on_case(gate, passed)

    def train(self, gate: str, case: TrainingSpec) -> dict[str, Any]:
        """Runs a training gate (raises like ``check``) and records its loss curve for the report.

        Returns rank 0's figures: ``train_bits`` (mean per-rank training loss at each step, in
        bits per byte) and ``held_out_bits`` (before and after training)."""
        outcome = self.check(gate, case, task="training")
        figures: dict[str, Any] = {k: v for k, v in outcome.results[0].items() if k != "records"}
        self.stream.write(
            {"kind": "training", "gate": gate, "case": case.describe(), "world_size": case.world_size, **figures},
            sync=True,
        )
        return figures

    def reproduce(self, gate: str, case: MoECase, *, env: dict[str, str] | None = None) -> Classified:
        """Runs an MoE scenario that may hang, abort or corrupt, and records what it did.

        Needs the pool: only the pool can kill a hung rank and start fresh ones. A hang is
        whatever is still running ``HANG_DEADLINE_S`` after the start; ``env`` (e.g.
        ``TORCH_DISTRIBUTED_DEBUG=DETAIL``) applies to fresh ranks for this run.

        The fixed model does one forward and backward first, under the ordinary case
        timeout: fresh ranks spend seconds on their first FSDP2 step (about 5 s on a GPU),
        which must not count against the naive run's deadline.
        """
        if self.launcher or not isinstance(self.pool, RankPool):
            pytest.skip("reproducing a hang or an abort needs the rank pool: torchrun cannot replace a lost rank")
        warm = self.pool.run(warm_up, case.with_variant("fixed"), world_size=case.world_size, env=env)
        if warm.failure is not None:
            raise GateFailure(f"the fixed model failed, so the naive one proves nothing: {warm.failure.describe()}")
        outcome = self.pool.run(
            run_training_case, (gate, case), world_size=case.world_size, timeout_s=HANG_DEADLINE_S, env=env
        )
        records = comparison_records(outcome)
        verdict = classify(outcome, records)
        self.stream.write(
            {
                "kind": "scenario",
                "gate": gate,
                "scenario": case.name,
                "wrapping": case.wrapping,
                "variant": case.variant,
                "no_tokens": [list(pair) for pair in case.empty],
                "env": env or {},
                "outcome": verdict.outcome,
                "detail": verdict.detail,
                "collectives": list(verdict.collectives),
                "seconds": outcome.seconds,
                "case": case.describe(),
            },
            sync=True,
        )
        if self.on_case is not None:
            self.on_case(gate, True)
        return verdict

    def __repr__(self) -> str:  # hypothesis prints it in every failing example
        return (
            f"GateRunner(nproc={self.pool.nproc}, impl={self.impl.spec if self.impl else None!r}, "
            f"kernel={self.kernel.spec if self.kernel else None!r})"
        )

    def _resolve(self, case: Case | TrainingSpec) -> Case | TrainingSpec:
        if self.kernel is not None and isinstance(case, Case) and case.kernel is None:
            case = replace(case, kernel=self.kernel.spec)
        if self.impl is None or case.candidate != DEFAULT_CANDIDATE:
            return case
        if isinstance(case, Case) and case.kernel:
            pytest.skip(f"{self.impl.spec} brings its own Newton–Schulz: kernel gates run ShardedMuon only")
        try:
            return self.impl.adapt(case) if isinstance(case, Case) else self.impl.adapt_training(case)
        except UnsupportedConvention as e:
            pytest.skip(str(e))


def comparison_records(outcome: CaseOutcome) -> list[dict[str, Any]]:
    """Every rank's comparison records; a task returns a list of them or a dict with ``records``."""
    per_rank = [r["records"] if isinstance(r, dict) else r for r in outcome.results if r]
    return [record for records in per_rank for record in records]


def verdict_message(case: Case | TrainingSpec, outcome: CaseOutcome, records: list[dict[str, Any]]) -> str | None:
    """``None`` when the case passed; otherwise what went wrong, worst comparison first."""
    if outcome.failure is not None:
        return outcome.failure.describe()
    if not records:
        return "the case compared nothing"
    if all(r["all_zero"] or r["numel"] == 0 for r in records):
        return "every comparison was of all-zero or empty tensors: the case compares nothing"
    bad = [r for r in records if not r["passed"]]
    if not bad:
        return None
    bad.sort(key=lambda r: (-r["max_ulp"], r["step"], r["tensor"]))
    lines = [f"{len(bad)} of {len(records)} comparisons failed; worst first:"]
    for r in bad[:8]:
        lines.append(
            f"  {r['tensor']} step {r['step']} rank {r['rank']} [{r['tier']}]: max|diff| {r['max_abs_diff']:.3g}, "
            f"max ULP {r['max_ulp']:g}, {r['mismatches']}/{r['numel']} differ, worst at {r['worst_index']}: "
            f"expected {r['expected_at_worst']!r} got {r['actual_at_worst']!r}"
        )
    return "\n".join(lines)


def reproduce_command(nodeid: str, nproc: int, launcher: bool) -> str:
    """The command that reruns the failing test; hypothesis replays the failure from its database
    (or from the ``@reproduce_failure`` blob it prints)."""
    if not nodeid:
        return ""
    if launcher:
        return f"torchrun --nproc-per-node {nproc} -m pytest '{nodeid}'"
    return f"pytest '{nodeid}' --nproc {nproc}"
