"""Per-case overhead of the persistent rank pool against spawning a process group per case.

    python -m benchmarks.pool_overhead [--nproc 2] [--cases 200] [--spawns 5]

Both sides run the same trivial case (one all-reduce of one float on every rank). The
pool side times ``RankPool.run`` end to end (IPC there and back included); the baseline
spawns ``nproc`` fresh processes that import torch, form a process group, run the case
and exit, which is what a harness without a pool pays per case.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch.multiprocessing as tmp

from harness.ranks import RankPool
from harness.runner import RANK_PRELOAD
from harness.tasks import selftest as selftest_tasks


def _spawned_case(rank: int, nproc: int, init_file: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=nproc)
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()


def spawn_per_case(nproc: int, repeats: int) -> list[float]:
    import os
    import tempfile

    times = []
    for i in range(repeats):
        with tempfile.TemporaryDirectory() as d:
            start = time.perf_counter()
            tmp.spawn(_spawned_case, args=(nproc, os.path.join(d, f"init{i}")), nprocs=nproc, join=True)
            times.append(time.perf_counter() - start)
    return times


def pool_per_case(nproc: int, cases: int) -> tuple[float, list[float]]:
    with RankPool(nproc, preload=RANK_PRELOAD) as pool:
        start = time.perf_counter()
        pool.run(selftest_tasks.sum_of_ranks)
        startup = time.perf_counter() - start
        times = []
        for _ in range(cases):
            start = time.perf_counter()
            outcome = pool.run(selftest_tasks.sum_of_ranks)
            times.append(time.perf_counter() - start)
            if not outcome.ok:
                raise RuntimeError(outcome.failure.describe() if outcome.failure else "failed")
    return startup, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--spawns", type=int, default=5)
    args = parser.parse_args()
    startup, pool_times = pool_per_case(args.nproc, args.cases)
    spawn_times = spawn_per_case(args.nproc, args.spawns)
    pool_median = statistics.median(pool_times)
    spawn_median = statistics.median(spawn_times)
    print(f"nproc {args.nproc}, gloo on CPU")
    print(f"pool start-up (spawn + process groups + first case): {startup:.2f} s")
    print(f"pool, per trivial case: median {pool_median * 1e3:.2f} ms over {len(pool_times)} cases")
    print(f"spawn per case:         median {spawn_median:.2f} s over {len(spawn_times)} cases")
    print(f"ratio spawn/pool: {spawn_median / pool_median:.0f}x")


if __name__ == "__main__":
    main()
