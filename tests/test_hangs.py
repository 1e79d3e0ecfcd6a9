"""Claims about what the rank pool calls a hang: a case with no progress for a while past its
deadline, never one whose ranks still progress, however slowly; and what it shows of a rank
that hung or died: the rank's own frames and, for a rank killed by a signal, the library's
reason first.

The tasks live here, at module level, so that the ranks import them by name."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from harness.ranks import RankContext, RankPool
from harness.ranks.pool import _Stall
from harness.ranks.stacks import main_thread_frames
from harness.runner import RANK_PRELOAD
from harness.verdicts.outcomes import classify


def all_reduce_for(ctx: RankContext, payload: tuple[int, float]) -> int:
    """Every rank all-reduces ``numel`` floats over and over for ``seconds`` (rank 0's clock,
    carried in the same all-reduce, so that all stop after the same one): always inside a
    collective that completes, never outside one for more than a moment. Returns the rounds."""
    numel, seconds = payload
    t = torch.zeros(numel + 1)
    end = time.monotonic() + seconds
    rounds = 0
    while True:
        t[0] = float(ctx.rank == 0 and time.monotonic() >= end)
        dist.all_reduce(t, group=ctx.group)
        rounds += 1
        if t[0] > 0:
            return rounds


def progress_then_sleep(ctx: RankContext, seconds: float) -> int:
    """Every rank all-reduces for ``seconds``; then rank 1 sleeps far past any deadline while
    rank 0 waits for it in an all-reduce."""
    all_reduce_for(ctx, (1, seconds))
    if ctx.rank == 1:
        time.sleep(3600)
    dist.all_reduce(torch.zeros(1), group=ctx.group)
    return ctx.rank


def size_mismatch_deep(ctx: RankContext, depth: int) -> int:
    """From ``depth`` nested calls (a long stack, as a model's forward gives), rank 0 all-reduces 3
    floats and rank 1 five: gloo aborts a rank, which prints why before Python's fatal-signal report."""
    if depth > 0:
        return size_mismatch_deep(ctx, depth - 1)
    dist.all_reduce(torch.zeros(3 if ctx.rank == 0 else 5), group=ctx.group)
    return ctx.rank


@pytest.fixture(scope="module")
def pool():
    with RankPool(2, preload=RANK_PRELOAD, case_timeout_s=30) as p:
        yield p


def test_ranks_that_stay_inside_completing_collectives_past_the_deadline_are_not_a_hang(pool: RankPool) -> None:
    """The false hang of a loaded 16-core machine: ranks in all-reduces and gathers that complete,
    slowly, past the deadline. Each look at the deadline finds every rank inside a collective;
    the bytes they move say it completes."""
    outcome = pool.run(all_reduce_for, (1_000_000, 3.0), timeout_s=1)
    assert outcome.ok, outcome.failure and outcome.failure.describe()
    assert outcome.seconds >= 3.0 and outcome.results[0] == outcome.results[1] > 1


def test_a_rank_that_waits_forever_after_progressing_is_a_hang_soon_after_the_deadline(pool: RankPool) -> None:
    """No progress for ``MIN_QUIET_S`` (here longer than half the deadline) after the last: a
    hang, naming where the waiting rank waits."""
    outcome = pool.run(progress_then_sleep, 0.5, timeout_s=2)
    assert outcome.failure is not None and outcome.failure.kind == "hang", outcome.failure
    assert "none progressed for" in outcome.failure.message
    assert "rank 0 waits in all_reduce" in outcome.failure.message
    assert 2.0 <= outcome.seconds < 5.0
    assert pool.run(all_reduce_for, (1, 0.0)).ok


def test_a_ranks_stack_holds_its_own_frames_not_those_of_whoever_started_the_forkserver(pool: RankPool) -> None:
    """The forkserver may be a fork of this session, made inside whichever test first started a
    pool; frames older than the rank's ``_worker_main`` are that test's, not the rank's."""
    outcome = pool.run(progress_then_sleep, 0.0, timeout_s=1)
    assert outcome.failure is not None and outcome.failure.kind == "hang"
    for rank, text in outcome.failure.stacks.items():
        frames = main_thread_frames(text)
        assert frames and frames[-1].func == "_worker_main", f"rank {rank}:\n{text}"
    died = pool.run(size_mismatch_deep, 0)
    assert died.failure is not None and died.failure.kind == "died"
    frames = main_thread_frames(died.failure.message)
    assert frames and frames[-1].func == "_worker_main", died.failure.message


def test_an_abort_leads_with_the_librarys_reason_not_pythons_list_of_extension_modules(pool: RankPool) -> None:
    """A rank that gloo aborts from deep in its stack: Python's report of the fatal signal (its
    frames, then every extension module loaded) is longer than the log's tail that is kept, and
    its last line is the module list. The headline, the outcome's detail and the message lead
    with gloo's words."""
    outcome = pool.run(size_mismatch_deep, 120)
    failure = outcome.failure
    assert failure is not None and failure.kind == "died" and failure.exitcode == -6, failure
    reason = "Received data size doesn't match expected size"
    assert reason in failure.headline() and "Extension modules" not in failure.headline(), failure.headline()
    assert reason in classify(outcome, []).detail
    assert reason in failure.describe().splitlines()[0]
    assert "Extension modules" not in failure.message


def _dump(caller: str, line: int) -> str:
    """A rank's main-thread stack, as its reader answers, waiting in FSDP2's all-gather of the
    module that ``caller``'s ``line`` runs."""
    frames = [
        ("torch/distributed/distributed_c10d.py", 4330, "all_gather_single"),
        ("torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", 119, "__call__"),
        ("torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py", 410, "unshard"),
        ("torch/distributed/fsdp/_fully_shard/_fsdp_state.py", 250, "_pre_forward"),
        ("torch/nn/modules/module.py", 1800, "_call_impl"),
        (f"harness/models/{caller}", line, "forward"),
        ("harness/ranks/pool.py", 220, "_worker_main"),
    ]
    rows = "".join(f'  File "/site-packages/{f}", line {n} in {fn}\n' for f, n, fn in frames)
    return "Current thread 0x00007f0000000001 (most recent call first):\n" + rows


def test_ranks_at_different_call_sites_are_not_stuck_until_none_progressed_for_the_stall_time() -> None:
    """A correct FSDP2 training case was once called hung in two looks a tenth of a second
    apart: rank 1 had read rank 0's bytes and gone on to the next module's all-gather while rank
    0, descheduled on 2 busy cores, had not yet read rank 1's. Different call sites are no proof
    of a deadlock; no progress for the stall time is."""
    stall = _Stall(stall_s=1.0)
    dumps = {0: _dump("corpus.py", 47), 1: _dump("transformer.py", 157)}
    assert stall.observe(dumps, moved=None, now=10.0) is None
    assert stall.observe(dumps, moved=False, now=10.1) is None
    assert stall.observe(dumps, moved=False, now=10.9) is None
    assert stall.observe(dumps, moved=True, now=11.2) is None, "a byte moved: the clock starts again"
    stuck = stall.observe(dumps, moved=False, now=12.2)
    assert stuck is not None and stuck[0] != stuck[1]
    assert stuck[1] == "all_gather_single in _pre_forward, called from transformer.py:157 in forward"
