"""Claims about the rank pool: real process groups, reused across cases, and a rank that
raises, hangs or dies is reported with its rank, exit code and stack while the pool
recovers for the next case."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from support import repo_env

from harness.ranks import RankPool
from harness.runner import RANK_PRELOAD
from harness.tasks import selftest as tasks


@pytest.fixture(scope="module")
def pool():
    with RankPool(2, preload=RANK_PRELOAD, case_timeout_s=30, pg_timeout_s=10) as p:
        yield p


def test_ranks_share_a_real_process_group(pool):
    outcome = pool.run(tasks.sum_of_ranks)
    assert outcome.ok and outcome.results == [1.0, 1.0]


def test_back_to_back_cases_reuse_the_same_processes(pool):
    first = pool.run(tasks.pid)
    second = pool.run(tasks.pid)
    assert first.ok and first.results == second.results


def test_smaller_world_runs_on_the_first_ranks_only(pool):
    outcome = pool.run(tasks.sum_of_ranks, world_size=1)
    assert outcome.ok and outcome.results == [0.0, None]
    assert pool.run(tasks.sum_of_ranks).results == [1.0, 1.0]


def test_rank_that_raises_is_reported_and_peers_are_not_left_waiting(pool):
    pool.run(tasks.sum_of_ranks)
    spawns = pool.spawns
    start = time.monotonic()
    outcome = pool.run(tasks.raise_on_rank, 1)
    assert outcome.failure is not None and outcome.failure.kind == "error" and outcome.failure.rank == 1
    assert "planted failure on rank 1" in outcome.failure.message
    assert "all_reduce" in outcome.failure.stacks[0], "rank 0's stack shows where it waited"
    assert time.monotonic() - start < 10
    assert pool.run(tasks.sum_of_ranks).results == [1.0, 1.0]
    assert pool.spawns == spawns + 1, "a rank left waiting in a collective gets a fresh process"


def test_ranks_that_all_raised_keep_their_processes_and_get_fresh_groups(pool):
    """Rank 0 left an all-reduce of four 7s unmatched: on the old groups, the next case's
    all-reduce on rank 1 would meet it (a size mismatch, or a wrong sum)."""
    before = pool.run(tasks.pid).results
    spawns, regroups = pool.spawns, pool.regroups
    outcome = pool.run(tasks.raise_past_an_unmatched_collective)
    assert outcome.failure is not None and outcome.failure.kind == "error", outcome.failure
    assert (pool.spawns, pool.regroups) == (spawns, regroups + 1)
    assert pool.run(tasks.sum_of_ranks).results == [1.0, 1.0]
    assert pool.run(tasks.pid).results == before


def test_a_closed_pool_leaves_nothing_in_the_temp_directory_even_after_a_rank_died_mid_checkpoint():
    with RankPool(2, preload=RANK_PRELOAD, case_timeout_s=30, pg_timeout_s=10) as p:
        logs = Path(p._logdir)
        # checkpoints go to the pool's scratch in memory where the machine has one (/dev/shm)
        scratch = logs if p._memory is None else Path(p._memory)
        assert p.run(tasks.sum_of_ranks).ok
        saved = p.run(tasks.checkpoint_then_die, 1)
        assert saved.failure is not None and saved.failure.rank == 1
        survivor = p.run(tasks.checkpoint_then_die, 2).results[0]
        assert Path(survivor).parent == scratch and Path(survivor).exists()
    assert not logs.exists() and not scratch.exists()


def test_a_new_pool_removes_the_directories_of_pools_whose_process_was_killed(tmp_path: Path):
    """A session killed by SIGKILL cannot remove its pool's directories (on /dev/shm they hold
    memory): the next pool removes those whose owner process is gone, and keeps a running
    process's and any not named by a process."""
    import subprocess
    import sys

    from harness.ranks.pool import sweep_abandoned

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead, alive, other = (
        tmp_path / f"muongate-pool-{gone.stdout.strip()}-abc",
        tmp_path / f"muongate-pool-{os.getpid()}-def",
        tmp_path / "muongate-pool-ghi",
    )
    for d in (dead, alive, other):
        (d / "checkpoint").mkdir(parents=True)
    assert sweep_abandoned(str(tmp_path)) == [str(dead)]
    assert not dead.exists() and alive.exists() and other.exists()


def test_hanging_rank_is_detected_within_the_deadline_and_the_next_case_passes(pool):
    assert pool.run(tasks.sum_of_ranks).ok  # the ranks up, whichever test ran first
    spawns = pool.spawns
    start = time.monotonic()
    outcome = pool.run(tasks.hang_on_rank, 1, timeout_s=2)
    assert outcome.failure is not None and outcome.failure.kind == "hang" and outcome.failure.rank == 1
    assert "hang_on_rank" in outcome.failure.stacks[1]
    assert time.monotonic() - start < 6
    assert pool.run(tasks.sum_of_ranks).results == [1.0, 1.0]
    assert pool.spawns == spawns + 1


def test_a_rank_still_computing_at_its_deadline_is_given_time_and_its_case_completes(pool):
    """Slow is not stuck: a first compile on a crowded machine outlasted a 120 s deadline once."""
    outcome = pool.run(tasks.compute_on_rank, (1, 2.5), timeout_s=1)
    assert outcome.ok and outcome.results == [0, 1], outcome.failure
    assert outcome.seconds >= 2.5


def test_a_rank_that_computes_forever_is_still_a_hang_at_four_times_its_deadline(pool):
    outcome = pool.run(tasks.compute_on_rank, (1, 3600.0), timeout_s=0.5)
    assert outcome.failure is not None and outcome.failure.kind == "hang", outcome.failure
    assert "nor in the 4 times as long given while they still progressed (the cap)" in outcome.failure.message
    assert 2.0 <= outcome.seconds < 10
    assert pool.run(tasks.sum_of_ranks).ok


def test_rank_killed_by_a_signal_is_reported_with_its_exit_code(pool):
    outcome = pool.run(tasks.die_on_rank, 0)
    assert outcome.failure is not None and outcome.failure.kind == "died" and outcome.failure.rank == 0
    assert outcome.failure.exitcode == -6 and "SIGABRT" in outcome.failure.describe()
    assert "die_on_rank" in outcome.failure.message
    assert pool.run(tasks.sum_of_ranks).results == [1.0, 1.0]


def test_world_size_outside_the_pool_is_a_clear_error(pool):
    with pytest.raises(ValueError, match="world_size=3 must be between 1 and the pool's nproc=2"):
        pool.run(tasks.sum_of_ranks, world_size=3)


def test_case_env_reaches_the_collective_library_and_is_dropped_afterwards(pool):
    detail = pool.run(tasks.debug_level, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert detail.results == ["DebugLevel.DETAIL"] * 2
    assert pool.run(tasks.debug_level).results == ["DebugLevel.OFF"] * 2


def test_every_failing_rank_keeps_its_own_message(pool):
    outcome = pool.run(tasks.raise_on_every_rank)
    assert outcome.failure is not None
    first, other = outcome.failure.rank, 1 - outcome.failure.rank
    assert f"planted failure on rank {first}" in outcome.failure.message
    assert f"planted failure on rank {other}" in outcome.failure.stacks[other]


def test_a_rank_busy_in_a_collectives_helper_is_not_waiting_in_a_collective() -> None:
    from harness.ranks.stacks import collective, main_thread_frames

    def dump(*inner: str) -> str:
        frames = [*inner, '  File "/w/harness/ranks/pool.py", line 9 in _worker_main']
        return "Current thread 0x1 (most recent call first):\n" + "\n".join(frames)

    torch = "/v/site-packages/torch/distributed"
    busy = dump(
        f'  File "{torch}/checkpoint/filesystem.py", line 930 in read_metadata',
        f'  File "{torch}/checkpoint/state_dict_loader.py", line 234 in local_step',
        f'  File "{torch}/checkpoint/utils.py", line 193 in reduce_scatter',
        '  File "/w/harness/tasks/optimizer.py", line 308 in _dcp_load',
    )
    waiting = dump(
        f'  File "{torch}/distributed_c10d.py", line 4000 in all_gather',
        f'  File "{torch}/c10d_logger.py", line 81 in wrapper',
        f'  File "{torch}/checkpoint/utils.py", line 193 in all_gather_object',
        '  File "/w/harness/tasks/optimizer.py", line 308 in _dcp_load',
    )
    unpickling = dump(
        f'  File "{torch}/distributed_c10d.py", line 3100 in _tensor_to_object',
        f'  File "{torch}/distributed_c10d.py", line 3500 in broadcast_object_list',
        f'  File "{torch}/checkpoint/utils.py", line 120 in broadcast_object',
        '  File "/w/harness/tasks/optimizer.py", line 309 in _dcp_load',
    )
    assert collective(main_thread_frames(busy)) is None
    assert collective(main_thread_frames(unpickling)) is None
    assert (
        collective(main_thread_frames(waiting))
        == "all_gather in all_gather_object, called from optimizer.py:308 in _dcp_load"
    )


@pytest.mark.parametrize("nproc", [4, 8])
def test_ranks_busy_on_their_subgroup_are_not_a_hang_while_others_wait_on_another_group(nproc):
    """Half the ranks loop over large all-reduces on their own row for about a second or more
    while the other half wait over the columns: every collective can complete, and does."""
    with RankPool(nproc, preload=RANK_PRELOAD, case_timeout_s=120) as grid:
        numel, reps = 25_000_000 // nproc, 10
        outcome = grid.run(tasks.subgroup_busy_while_others_wait, (numel, reps))
        assert outcome.ok, outcome.failure and outcome.failure.describe()
        assert outcome.results == list(range(nproc))
        start = time.monotonic()
        crossed = grid.run(tasks.subgroups_cross)
        assert crossed.failure is not None and crossed.failure.status == "hang", crossed
        assert "no rank can complete its collective" in crossed.failure.message
        assert time.monotonic() - start < grid.stall_s + 3, "a real deadlock is still named in seconds"


def test_the_forkserver_forks_ranks_with_no_thread_but_those_of_importing_torch(pool):
    """A forked rank inherits every thread's locks and state but not the threads: the server
    that forks ranks holds only what a fresh ``import torch`` holds (the interpreter's thread
    and OpenBLAS's, which stops its own around a fork), nothing of gloo's or torch's."""
    import multiprocessing.forkserver
    import subprocess
    import sys

    pool.run(tasks.sum_of_ranks)
    server = multiprocessing.forkserver._forkserver._forkserver_pid
    names = sorted(
        Path(f"/proc/{server}/task/{t}/comm").read_text().strip() for t in os.listdir(f"/proc/{server}/task")
    )
    fresh = "import os, torch; print(len(os.listdir('/proc/self/task')))"
    baseline = int(subprocess.run([sys.executable, "-c", fresh], capture_output=True, text=True, check=True).stdout)
    assert not [n for n in names if n.startswith(("gloo", "pt_"))], names
    assert len(names) <= baseline, f"the forkserver holds {names}; a fresh import of torch holds {baseline} threads"


def test_a_ranks_threads_count_every_pool_on_the_host(tmp_path, monkeypatch):
    """Each pool registers its ranks; a rank's share is the usable cores over every live rank
    on the host, a pool whose process is gone does not count, and OMP_NUM_THREADS or an
    explicit count fixes it."""
    from harness.ranks.budget import ThreadBudget, usable_cores

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    mine, other = ThreadBudget(2, registry=tmp_path), ThreadBudget(3, registry=tmp_path)
    mine.register()
    assert mine.host_ranks() == 2
    other.register()
    assert mine.host_ranks() == 5 and mine.threads() == max(1, usable_cores() // 5)
    (tmp_path / "999999999-gone").write_text("64")  # a pool whose process died without unregistering
    assert mine.host_ranks() == 5 and not (tmp_path / "999999999-gone").exists()
    other.unregister()
    assert mine.host_ranks() == 2
    assert ThreadBudget(2, threads=3, registry=tmp_path).threads() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert ThreadBudget(8, registry=tmp_path).threads() == 2


_SERVER_OF_A_FRESH_PROCESS = """
import os, sys, threading, time
from multiprocessing import forkserver
from harness.ranks import RankPool
from harness.tasks import selftest as tasks

if sys.argv[1] == "thread":
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
with RankPool(2, case_timeout_s=30) as pool:
    assert pool.run(tasks.sum_of_ranks).results == [1.0, 1.0]
    assert pool.run(tasks.die_on_rank, 1).failure.kind == "died"
    assert pool.run(tasks.sum_of_ranks).results == [1.0, 1.0]
    server = forkserver._forkserver._forkserver_pid
    with open(f"/proc/{server}/cmdline", "rb") as f:
        print("forked" if f.read() == open("/proc/self/cmdline", "rb").read() else "started afresh")
"""


@pytest.mark.parametrize(("threads", "server"), [("none", "forked"), ("thread", "started afresh")])
def test_the_forkserver_is_forked_from_a_process_with_one_thread_and_started_afresh_otherwise(
    tmp_path: Path, threads: str, server: str
) -> None:
    """A gate session's forkserver is a fork of it (``harness.ranks.forkserver``), so that its
    ranks need not import torch and the tasks again; a process with a thread of its own gets
    a server started the usual way, and so does a CUDA build of torch (whose forked ranks
    cannot use CUDA). Either serves ranks that die and are replaced."""
    import subprocess
    import sys

    import torch

    if torch.backends.cuda.is_built():
        server = "started afresh"

    run = subprocess.run(
        [sys.executable, "-c", _SERVER_OF_A_FRESH_PROCESS, threads],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path, env=repo_env(),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == server


def test_a_checkpoint_goes_to_the_memory_scratch_only_where_it_has_room(monkeypatch, tmp_path):
    from harness.ranks.pool import MEMORY_SCRATCH, SCRATCH
    from harness.tasks import checkpoint

    memory, disk = tmp_path / "memory", tmp_path / "disk"
    memory.mkdir()
    monkeypatch.setenv(MEMORY_SCRATCH, str(memory))
    monkeypatch.setenv(SCRATCH, str(disk))
    free = 1 << 30
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(2 * free, free, free))
    assert checkpoint._scratch(free // checkpoint._ROOM) == str(memory)
    assert checkpoint._scratch(free // checkpoint._ROOM + 1) == str(disk)
    monkeypatch.delenv(MEMORY_SCRATCH)
    assert checkpoint._scratch(0) == str(disk)
