"""Rank tasks by name, and running a case on the session's ranks: the persistent pool, or the
ranks ``torchrun`` started (``harness.ranks``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from harness.ranks import LauncherGroup, RankContext, RankPool
from harness.runner.ran import Ran, RankCase
from harness.tasks.engine import run_engine_case
from harness.tasks.kernel import run_kernel_case
from harness.tasks.muon import run_cause_case, run_orthogonalize_case, run_spectrum_case, run_update_case
from harness.tasks.optimizer import run_backward_case, run_optimizer_case, run_routing_case
from harness.tasks.pipeline import run_pipeline_case
from harness.tasks.reshard import run_reshard_case
from harness.tasks.result import TaskResult
from harness.tasks.training import run_training_case, run_training_twins

TASKS: dict[str, Callable[[RankContext, Any], TaskResult]] = {
    "optimizer": run_optimizer_case,
    "routing": run_routing_case,
    "orthogonalize": run_orthogonalize_case,
    "backward": run_backward_case,
    "spectrum": run_spectrum_case,
    "reshard": run_reshard_case,
    "update": run_update_case,
    "causes": run_cause_case,
    "training": run_training_case,
    "twins": run_training_twins,
    "pipeline": run_pipeline_case,
    "kernel": run_kernel_case,
    "engine": run_engine_case,
}


#: what the pool's forkserver imports for the gates' ranks (``RankPool(preload=…)``): every task
#: module ``TASKS`` runs, and the warm-up that steps ``ShardedMuon`` once on torch's ``fake``
#: backend, so that a rank forked from the server starts warm (``harness.tasks.warmup``)
RANK_PRELOAD: tuple[str, ...] = (
    *sorted({task.__module__ for task in TASKS.values()}),
    "harness.tasks.selftest",
    "harness.tasks.warmup",
)


def run_on(
    pool: RankPool | LauncherGroup,
    case: RankCase,
    task: str,
    *,
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
) -> Ran:
    """Runs ``TASKS[task]`` on the case's ranks; what happened, every rank's comparisons gathered."""
    world = case.world_size
    if world > pool.nproc:
        raise ValueError(f"{case.describe()} needs {world} ranks; the pool has --nproc {pool.nproc}")
    if isinstance(pool, RankPool):
        outcome = pool.run(TASKS[task], case, world_size=world, timeout_s=timeout_s, env=env)
    else:
        outcome = pool.run(TASKS[task], case, world_size=world)
    results = [r for r in outcome.results if isinstance(r, TaskResult)]
    comparisons = tuple(c for r in results for c in r.comparisons)
    figures = outcome.results[0].figures if isinstance(outcome.results[0], TaskResult) else {}
    return Ran(case, outcome, comparisons, figures, tuple(route for r in results for route in r.routes))
