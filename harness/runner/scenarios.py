"""Gates that are scenarios rather than single comparisons: training a model (its loss curve
goes into the report beside the verdict) and reproducing the MoE failures on purpose."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import pytest

from harness.ranks import LauncherGroup, RankPool
from harness.runner.findings import fail
from harness.runner.ran import Ran
from harness.runner.record import Recorder
from harness.runner.routing import judge_routes
from harness.tasks.training import TrainingSpec, warm_up
from harness.verdicts.outcomes import HANG_DEADLINE_S, Classified, classify
from reports.records import Routing, Scenario, Training


class Runs(Protocol):
    """What a scenario needs of the runner (``GateRunner``)."""

    pool: RankPool | LauncherGroup
    launcher: bool
    recorder: Recorder

    def check(self, gate: str, case: Any, *, task: str = ..., exact: bool = ...) -> Ran: ...

    def run(
        self, case: Any, *, task: str = ..., timeout_s: float | None = ..., env: Mapping[str, str] | None = ...
    ) -> Ran: ...


def train(runner: Runs, gate: str, spec: TrainingSpec) -> Mapping[str, Any]:
    """Runs a training gate (fails like ``GateRunner.check``) and writes its loss curve for the
    report, and which algorithm stepped each of the model's parameters (``Routing``): a matrix
    that stepped as another algorithm than its group declares fails it.

    Returns rank 0's figures: ``train_bits`` (mean per-rank training loss at each step, in
    bits per byte) and ``held_out_bits`` (before and after training)."""
    __tracebackhide__ = True
    ran = runner.check(gate, spec, task="training")
    if ran.routes:
        rows, status, message = judge_routes(ran.routes)
        model = f"the {spec.name} model, world {ran.case.world_size}"
        runner.recorder.write(Routing(gate, model, "candidate", rows))
        if status == "failed":
            fail(f"{gate}: {message}\nminimal case: {ran.case.describe()}")
    runner.recorder.write(
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


def reproduce(runner: Runs, gate: str, case: Any, *, env: dict[str, str] | None = None) -> Classified:
    """Runs an MoE scenario that may hang, abort or corrupt, and writes what it did.

    Needs the pool: only the pool can kill a hung rank and start fresh ones. A hang is
    whatever is still running ``HANG_DEADLINE_S`` after the start; ``env`` (e.g.
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL``) applies to fresh ranks for this run.

    The fixed model does one forward and backward first, under the ordinary case
    timeout: fresh ranks spend seconds on their first FSDP2 step (about 5 s on a GPU),
    which must not count against the naive run's deadline.
    """
    __tracebackhide__ = True
    pool = runner.pool
    if runner.launcher or not isinstance(pool, RankPool):
        pytest.skip("reproducing a hang or an abort needs the rank pool: torchrun cannot replace a lost rank")
    warm = pool.run(warm_up, case.with_variant("fixed"), world_size=case.world_size, env=env)
    if warm.failure is not None:
        fail(f"the fixed model failed, so the naive one proves nothing: {warm.failure.describe()}")
    ran = runner.run(case, task="training", timeout_s=HANG_DEADLINE_S, env=env)
    verdict = classify(ran.outcome, ran.comparisons)
    runner.recorder.write(
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
    runner.recorder.scenario_done(gate)
    return verdict
