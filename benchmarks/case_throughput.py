"""Cases per second through the whole gate path, and where the time goes.

    python -m benchmarks.case_throughput [--nproc 2] [--cases 300] [--max-side 128] [--checkpoint]

Draws optimizer cases with the gates' own strategy (one step, one to three matrices of
sides up to ``--max-side``, world sizes 1..nproc), runs each on the pool and judges it,
exactly as ``test_one_step_sharded_matches_reference_bitwise`` does (``--checkpoint``: the
checkpoint gate's cases, as ``test_checkpoint_round_trip_continues_bitwise`` does). Reports cases per
second and splits the time into hypothesis (drawing and bookkeeping in the parent), the
round trip to the ranks (pickling, pipes, waiting), and what rank 0 spent inside the
case by phase.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis.strategies import SearchStrategy

import reference
from harness.algorithms import MUON
from harness.cases import Case, ParamSpec, cases
from harness.ranks import RankPool
from harness.runner import RANK_PRELOAD, Ran
from harness.tasks.optimizer import run_optimizer_case
from harness.tasks.phases import last_phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--max-side", type=int, default=128)
    parser.add_argument("--checkpoint", action="store_true", help="the checkpoint gate's cases (a round trip each)")
    args = parser.parse_args()

    run_seconds: list[float] = []
    query_seconds: list[float] = []
    rank0: dict[str, float] = defaultdict(float)
    failures = 0
    with RankPool(args.nproc, preload=RANK_PRELOAD) as pool:
        pool.run(run_optimizer_case, Case(params=(ParamSpec("w", (4, 4)),), reference=reference.Muon))

        @settings(
            max_examples=args.cases,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=_strategy(args))
        def one(case: Case) -> None:
            nonlocal failures
            start = time.perf_counter()
            outcome = pool.run(run_optimizer_case, case, world_size=case.world_size)
            run_seconds.append(time.perf_counter() - start)
            comparisons = tuple(c for r in outcome.results if r for c in r.comparisons)
            failures += Ran(case, outcome, comparisons).message is not None
            asked = time.perf_counter()
            for phase, seconds in (pool.run(last_phases).results[0] or {}).items():
                rank0[phase] += seconds
            query_seconds.append(time.perf_counter() - asked)

        start = time.perf_counter()
        one()
        total = time.perf_counter() - start
    n = len(run_seconds)
    # Asking rank 0 for its phases is a second round trip per case: not part of a gate run.
    total -= sum(query_seconds)
    inside = sum(rank0.values())
    round_trips = sum(run_seconds)
    print(f"{n} cases, nproc {args.nproc}, sides <= {args.max_side}, {failures} failed")
    print(f"cases per second: {n / total:.1f} (total {total:.1f} s, phase queries excluded)")
    print(f"median case round trip: {statistics.median(run_seconds) * 1e3:.1f} ms")
    print("where the time goes, seconds per case:")
    print(f"  hypothesis and parent bookkeeping      {(total - round_trips) / n * 1e3:7.2f} ms")
    print(f"  IPC, pickling, waiting for ranks       {(round_trips - inside) / n * 1e3:7.2f} ms")
    for phase, seconds in sorted(rank0.items(), key=lambda kv: -kv[1]):
        print(f"  rank 0: {phase:31} {seconds / n * 1e3:7.2f} ms")


def _strategy(args: argparse.Namespace) -> SearchStrategy[Case]:
    """The one-step gate's cases, or (``--checkpoint``) the checkpoint gate's: up to four steps
    with a DCP round trip after one of them."""
    if args.checkpoint:
        return cases(
            max_world=args.nproc, max_steps=4, max_params=3, max_side=args.max_side, algorithm=MUON, checkpoint=True
        ).filter(lambda c: c.checkpoint_after)
    return cases(max_world=args.nproc, max_steps=1, max_params=3, max_side=args.max_side, adamw=False, algorithm=MUON)


if __name__ == "__main__":
    main()
