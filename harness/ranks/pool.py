"""A persistent pool of rank processes that runs one distributed case at a time.

Spawning a process group costs seconds; reusing one costs about a millisecond. The pool
spawns ``nproc`` workers once; they form one process group of ``nproc`` ranks and, once,
a subgroup of ranks ``0 .. w-1`` for every smaller world size ``w``. A case of world size
``w`` runs on that subgroup, so cases never create or destroy process groups (NCCL cannot
destroy a communicator while a peer sits out, and creating one costs far more than a
case). A case that fails leaves nothing of its collectives to the next: where every rank
returned (one or more raised), the ranks stay and make every process group afresh (``regroup``:
each rank destroys its groups, joins new ones under a new store prefix and warms them up), so
no half-matched collective, buffered message or mismatched sequence number of the failed case
can meet the next one's; a rank that hung or died, or a regroup that does not finish within
``REGROUP_S``, tears the whole pool down, and the next case gets fresh processes. A spawned
(CUDA) rank costs seconds to start, a regroup a fraction of one, and shrinking a candidate that
raises takes hundreds of failing cases.

Rendezvous never uses a fixed port: the parent owns a ``TCPStore`` bound to port 0, and
each spawn of the pool uses its own store prefix. Several pools (pytest-xdist workers)
therefore run side by side without colliding.

CPU (gloo) workers are forked from a ``forkserver`` that has imported torch and what the
pool's user names to preload (the gate session: the rank tasks and their warm-up,
``harness.runner.RANK_PRELOAD``) once, so fresh ranks are ready in a fraction of a second, not
seconds: a candidate that crashes on many cases costs one respawn per case, and shrinking such
a case takes hundreds of them. The server holds no thread of torch's, gloo's or OpenMP's when
it forks: the warm-up step runs on torch's ``fake`` backend, one thread
(``harness.tasks.warmup``; a child inherits other threads' locks and state but not the
threads, and an earlier server that warmed up on a gloo group forked beside gloo's three
threads). CUDA workers are spawned: a process forked from one that has touched the CUDA driver
cannot use CUDA.

Nothing hangs forever, and a hang is called in seconds, never for a rank that progresses.
While a case runs past ``sample_after_s``, the parent reads the pending ranks' Python stacks
from a thread in each rank that never interrupts it, and their progress (bytes moved, CPU
time, runnable threads) from ``/proc`` (``harness.ranks.watch``). A rank whose innermost frames inside torch include a blocking
``torch.distributed`` call is in a collective (``harness.ranks.stacks``). When every
pending rank sits in a collective, with the same stack, and none of them progressed since
the last look for ``stall_s`` (a second, more where ranks outnumber cores), the case is
stuck, whether the ranks wait at one call site, at different ones, or beside a rank that
has returned (``_Stall`` says why each needs the time); the verdict names each rank's
collective. Ranks that loop over
collectives of their own sub-group move bytes, so the ranks waiting for them on another group
are not called hung; a rank that is merely slow (compiling, computing, descheduled on a
busy machine) is not in a collective or is runnable, and is never called a hang either. The
case's wall-clock deadline is when a case that shows no progress becomes a hang, not when a
case must have finished: past it, the case is a hang once no rank of it has progressed for
``QUIET_S`` (or half its deadline, if shorter, but never under ``MIN_QUIET_S``), where progress is a rank that returned, a
main-thread stack that changed, a byte moved or a tenth of a second of CPU used in all since
the last progress (``harness.ranks.watch.Quiet``). A case whose ranks
still progress, inside collectives or outside them (four ranks of a correct tensor-parallel
optimizer, with other runs oversubscribing a 16-core machine twice, sat in their all-reduces
and gathers past a 120 s deadline and were called hung), runs on, up to ``SLOW_CAP`` times its
deadline, where the verdict says it was cut off there. The
process groups' own timeout is set past that, so the collective library never answers before
the harness does. A rank
killed by a signal (gloo aborts on a size-mismatched collective) is seen through its
process sentinel, with its exit code and the tail of its log, which holds what the C++ side
printed before it died (``faulthandler`` writes the stack of a rank that crashes there).

CPU ranks share the host's cores with every other pool on it (``harness.ranks.budget``):
before each case, each rank's thread count is set to the usable cores over the live ranks of
every pool on the host, unless ``OMP_NUM_THREADS`` or ``threads`` fixes it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any
from unittest import mock

from harness.ranks.budget import ThreadBudget, usable_cores
from harness.ranks.context import CaseOutcome, Groups, RankContext, RankFailure, make_groups
from harness.ranks.forkserver import fork_server
from harness.ranks.relay import BACKEND as RELAY
from harness.ranks.relay import register as register_relay
from harness.ranks.stacks import Frame, collective, crash_said, main_thread_frames, own_frames
from harness.ranks.switches import DEFAULTS
from harness.ranks.watch import Progress, Quiet, StackReader, serve_stacks

#: What the forkserver imports once for any pool; a pool's user names more (``RankPool(preload=…)``:
#: its tasks, a warm-up), so that every worker forked from it starts warm. The pool knows no task.
_OWN_PRELOAD = ["torch", "torch.distributed", "harness.ranks.pool"]


@dataclass(frozen=True)
class _Job:
    case_id: int
    world_size: int
    fn: Callable[[RankContext, Any], Any]
    payload: Any
    #: this rank's thread count for the case (CPU ranks; ``harness.ranks.budget``)
    threads: int | None = None


@dataclass(frozen=True)
class _Regroup:
    """Tells every rank to destroy its process groups and make them afresh under ``prefix``."""

    prefix: str


@dataclass(frozen=True)
class _WorkerSpec:
    rank: int
    nproc: int
    host: str
    port: int
    prefix: str
    backend: str
    device: str
    pg_timeout_s: float
    env: Mapping[str, str]
    log_path: str
    threads: int = 1
    #: multi-dim meshes to make groups for beyond the pool's own (``make_groups``)
    grids: tuple[tuple[int, ...], ...] = ()


#: the environment variable naming a pool's scratch directory to its ranks, removed with the pool
SCRATCH = "MUONGATE_POOL_SCRATCH"
#: the same for its scratch in memory (a tmpfs), where the machine has one: removed with the pool
MEMORY_SCRATCH = "MUONGATE_POOL_MEMORY_SCRATCH"
#: the tmpfs a memory scratch lies on (Linux's shared memory)
_MEMORY = "/dev/shm"

#: Stacks are read ``sample_after_s`` into a case, then after gaps that double from that up
#: to this, back to ``sample_after_s`` while every rank sits in a collective: a deadlock is
#: seen within a few tenths of a second, a long healthy case (training) is read a few times
#: a second at most.
_MAX_SAMPLE_GAP_S = 0.5

#: Past its deadline, a case some rank of which still progresses may run up to this many times
#: its deadline before it is called a hang: slow is not stuck, and nothing runs forever.
SLOW_CAP = 4.0

#: Past its deadline, a case is a hang once none of its ranks has progressed for this long (or
#: for half its deadline, where that is shorter: a case that sat still from its start is still
#: a hang at its deadline, not a look or two later). The ranks' activity is looked at every
#: ``_MAX_SAMPLE_GAP_S`` at most, and a rank that waits for a peer is asleep: ranks that show
#: nothing for seconds on end wait for something that will not come. Ten seconds is far beyond
#: a look's gap, and small beside a case's usual 120 s deadline: a case that stops progressing
#: near its deadline is named at most this much later than it was before.
QUIET_S = 10.0
#: the shortest quiet window, whatever the deadline: a rank computing through a 1 s deadline, on
#: the 2-core machine with three xdist workers' ranks beside it, showed less than 0.1 s of CPU in
#: a 0.5 s window and was called hung (2026-12-06); over 2 s it needs 5 % of a core to show
MIN_QUIET_S = 2.0

#: How long the ranks may take to make their process groups afresh after a failed case
#: (``RankPool._regroup``) before the pool is torn down instead: a rank whose old group still
#: waits on a peer's half of an asynchronous collective cannot destroy it, and gets a fresh process.
REGROUP_S = 15.0

#: How long, after a rank raised under ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, the pool waits for
#: peers that still progress to raise their own error, before it stops the case with their stacks.
_PEER_ERROR_S = 5.0


#: what a rank's stack reads as when its reader does not answer in time
_BUSY = "its stack reader did not answer in 0.2 s: its main thread holds the GIL\n"


class _Stall:
    """How long every pending rank has sat in a collective with the same stack, none progressing.

    The case is stuck once that has lasted ``stall_s``, wherever the ranks wait. Ranks at
    different call sites, or beside a rank that has returned, are no proof of a deadlock: a
    collective completes on each rank when that rank has read its peers' bytes, so a rank that
    has read them goes on to its next collective (or returns) while a peer, descheduled on a
    busy machine, has yet to read its own. The stack says the same until that peer runs, and
    its transport thread, runnable meanwhile, is not counted (``harness.ranks.watch``). Two
    looks in a row once sufficed at different call sites: a correct FSDP2 training case was
    called hung that way, rank 0 in an all-gather of one module's forward and rank 1 in the
    next module's, during a full run of the suite on 2 cores. ``moved``
    (``harness.ranks.watch.Progress``) is whether any pending rank progressed since the last
    look; ``None`` where that cannot be known."""

    def __init__(self, stall_s: float) -> None:
        self.stall_s = stall_s
        self._since: float | None = None
        self._frames: dict[int, list[Frame]] = {}

    @property
    def suspect(self) -> bool:
        """Whether the last look found every pending rank in a collective."""
        return self._since is not None

    def observe(
        self, dumps: dict[int, str], *, moved: bool | None = None, now: float | None = None
    ) -> dict[int, str] | None:
        """Each pending rank's collective once the case counts as stuck, else ``None``."""
        frames = {r: main_thread_frames(text) for r, text in dumps.items()}
        where = {r: c for r, f in frames.items() if (c := collective(f))}
        now = time.monotonic() if now is None else now
        if len(where) < len(dumps) or frames != self._frames or moved:
            self._since, self._frames = (now if len(where) == len(dumps) else None), frames
            return None
        assert self._since is not None
        return where if now - self._since >= self.stall_s else None


#: a pool's directories are named ``muongate-pool-<the owner's pid>-…``
_PREFIX = "muongate-pool-"


def _scratch(directory: str | None = None) -> str:
    """A directory of the pool's own in ``directory`` (the temporary directory), named by this
    process, after removing those of pools whose process is gone (``sweep_abandoned``)."""
    sweep_abandoned(directory or tempfile.gettempdir())
    return tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=directory)


def sweep_abandoned(directory: str) -> list[str]:
    """Removes the pool directories in ``directory`` whose owner process no longer runs (a
    session killed by a signal it cannot catch leaves them: on the tmpfs, they hold memory);
    returns their paths. A directory whose owner runs, or whose name gives none, is kept."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            owner = entry.name.removeprefix(_PREFIX).partition("-")[0]
            if entry.name.startswith(_PREFIX) and owner.isdigit() and not _runs(int(owner)):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
    return removed


def _runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def _memory_scratch() -> str | None:
    """A directory of the pool's own on the machine's tmpfs, or None where there is none to write."""
    if not os.path.isdir(_MEMORY):
        return None
    try:
        return _scratch(_MEMORY)
    except OSError:
        return None


def _worker_main(spec: _WorkerSpec, conn: Connection, stacks: Connection) -> None:
    log = open(spec.log_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    # C++ messages (gloo's abort reasons, NCCL warnings) go to fd 2: keep them for the parent.
    os.dup2(log.fileno(), 2)
    sys.stderr = log
    # A rank that crashes writes its stacks as it dies; a running rank is never interrupted
    # for them (harness.ranks.watch).
    faulthandler.enable(file=log, all_threads=True)
    os.environ.update(spec.env)
    reader = serve_stacks(stacks, root=sys._getframe())

    import torch
    import torch.distributed as dist

    # torch may have been imported (by the spawning script) before ``env`` was applied.
    dist.set_debug_level_from_env()
    if spec.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(spec.device))
    else:
        torch.set_num_threads(spec.threads)
    if spec.backend == RELAY:
        register_relay()
    store = dist.TCPStore(spec.host, spec.port, is_master=False, timeout=timedelta(seconds=60))
    groups = _join(spec, store, spec.prefix)
    conn.send(("ready", (os.getpid(), reader)))
    while True:
        job: _Job | _Regroup | None = conn.recv()
        if job is None:
            break
        if isinstance(job, _Regroup):
            try:
                if spec.device.startswith("cuda"):
                    torch.cuda.synchronize()  # a sticky CUDA error ends this process here
                dist.destroy_process_group()
                groups = _join(spec, store, job.prefix)
                conn.send(("ready", None))
                continue
            except BaseException:
                conn.send(("error", traceback.format_exc()))
                break
        try:
            if job.threads is not None and job.threads != torch.get_num_threads():
                torch.set_num_threads(job.threads)
            DEFAULTS.use()  # whatever the case before set (``harness.ranks.switches``)
            ctx = groups.context(spec.rank, job.world_size, spec.device, spec.backend, job.case_id)
            conn.send(("ok", job.fn(ctx, job.payload)))
        except BaseException:  # every failure goes back to the parent
            conn.send(("error", traceback.format_exc()))
    log.flush()
    # Skip interpreter teardown: destroying an NCCL communicator can wait for peers.
    os._exit(0)


def _join(spec: _WorkerSpec, store: Any, prefix: str) -> Groups:
    """Joins the pool's default group under ``prefix`` and makes and warms up every group a case can need."""
    import torch.distributed as dist

    dist.init_process_group(
        spec.backend,
        store=dist.PrefixStore(prefix, store),
        rank=spec.rank,
        world_size=spec.nproc,
        timeout=timedelta(seconds=spec.pg_timeout_s),
    )
    groups = make_groups(spec.nproc, spec.grids)
    _warm_up(spec, groups)
    return groups


def _warm_up(spec: _WorkerSpec, groups: Groups) -> None:
    """One collective on every group of this rank and one matrix product, before "ready".

    NCCL builds a communicator at its first collective and CUDA loads cuBLAS at the first
    matmul; on a fresh pool that takes seconds. Done here, it counts against the start-up
    timeout, not against the first case's deadline, where it would look like a hang.
    """
    import torch
    import torch.distributed as dist

    device = torch.device(spec.device)
    for group in groups.mine(spec.rank):
        dist.all_reduce(torch.ones(1, device=device), group=group)
    (torch.ones(2, 2, device=device) @ torch.ones(2, 2, device=device)).sum().item()


class RankPool:
    """``nproc`` rank processes reused across cases; see the module docstring."""

    def __init__(
        self,
        nproc: int,
        *,
        backend: str = "gloo",
        devices: list[str] | None = None,
        case_timeout_s: float = 60.0,
        pg_timeout_s: float | None = None,
        startup_timeout_s: float = 120.0,
        sample_after_s: float = 0.1,
        stall_s: float | None = None,
        threads: int | None = None,
        grids: tuple[tuple[int, ...], ...] = (),
        preload: Sequence[str] = (),
    ) -> None:
        if nproc < 1:
            raise ValueError(f"nproc={nproc} must be at least 1")
        if devices is not None and len(devices) != nproc:
            raise ValueError(f"devices={devices!r} must name one device per rank ({nproc})")
        self.nproc = nproc
        self.backend = backend
        #: what a CPU pool's forkserver imports before it forks a rank (the first pool's, for the process)
        self.preload = [*_OWN_PRELOAD, *preload]
        self.devices = devices or ["cpu"] * nproc
        #: multi-dim meshes beyond the pool's own that the ranks make groups for (a replayed capture's)
        self.grids = grids
        self.case_timeout_s = case_timeout_s
        # Past any case's deadline: the harness, not the library, says what a stuck case is.
        self.pg_timeout_s = pg_timeout_s if pg_timeout_s is not None else SLOW_CAP * case_timeout_s + 30.0
        self.startup_timeout_s = startup_timeout_s
        # More ranks than cores: a descheduled rank can keep a healthy collective waiting longer.
        crowded = max(1.0, nproc / usable_cores())
        self.sample_after_s = sample_after_s
        self.stall_s = stall_s if stall_s is not None else 1.0 * crowded
        self.spawns = 0
        #: how many times the ranks made their process groups afresh after a failed case
        self.regroups = 0
        #: each CPU rank's thread count, shared with every pool on the host
        self.budget = ThreadBudget(nproc, threads=threads)
        self._ctx: Any
        #: what CPU ranks and their forkserver must not see: the GPUs. On a machine with one,
        #: torch 2.11 marks every process forked from the server as a bad fork for CUDA, even
        #: where the server never initialized it, and the distributed checkpoint's file
        #: writer, seeing a GPU, takes a CUDA stream: "Cannot re-initialize CUDA in forked
        #: subprocess" on every checkpoint case (measured on the H200 machine's CPUs).
        self._hidden: dict[str, str] = {}
        if self.devices[0].startswith("cuda"):
            # A CUDA rank cannot be forked from a server that has touched the CUDA driver, and
            # the preload does: CUDA ranks are spawned, each paying its own start-up.
            self._ctx = mp.get_context("spawn")
        else:
            self._ctx = mp.get_context("forkserver")
            self._ctx.set_forkserver_preload(self.preload)
            self._hidden = {"CUDA_VISIBLE_DEVICES": ""}
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        #: each rank's stack reader (``harness.ranks.watch``), its process id and the reader's thread id
        self._stack_conns: list[Connection] = []
        self._watched: list[tuple[int, int | None]] = []
        self._reader = StackReader()
        self._logs: list[str] = []
        self._logdir = _scratch()
        self._memory = _memory_scratch()
        self._store: Any = None
        self._next_case = 0
        self._env: dict[str, str] = {}

    # -- life cycle -------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return bool(self._procs)

    def start(self) -> None:
        import torch.distributed as dist

        if not self.devices[0].startswith("cuda"):
            # Before the store's threads exist: the server may then be a fork of this process.
            fork_server(self.preload)
        if self._store is None:
            self._store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self.spawns += 1
        self.budget.register()
        threads = self.budget.threads()
        self._logs = [os.path.join(self._logdir, f"spawn{self.spawns}-rank{r}.log") for r in range(self.nproc)]
        for rank in range(self.nproc):
            parent_end, child_end = self._ctx.Pipe()
            stacks_parent, stacks_child = self._ctx.Pipe()
            spec = _WorkerSpec(
                rank=rank,
                nproc=self.nproc,
                host="127.0.0.1",
                port=self._store.port,
                prefix=f"spawn{self.spawns}",
                backend=self.backend,
                device=self.devices[rank],
                pg_timeout_s=self.pg_timeout_s,
                # Forked from the forkserver, a worker has the environment the server started
                # with: give it this process's, as it is now, and the case's on top.
                env={**os.environ, **self._hidden, SCRATCH: self._logdir, **self._memory_env(), **self._env},
                log_path=self._logs[rank],
                threads=threads,
                grids=self.grids,
            )
            proc = self._ctx.Process(
                target=_worker_main,
                args=(spec, child_end, stacks_child),
                daemon=True,
                name=f"muongate-rank{rank}",
            )
            with mock.patch.dict(os.environ, self._hidden):  # the forkserver starts with the first rank
                proc.start()
            child_end.close()
            stacks_child.close()
            self._procs.append(proc)
            self._conns.append(parent_end)
            self._stack_conns.append(stacks_parent)
        deadline = time.monotonic() + self.startup_timeout_s
        for rank, conn in enumerate(self._conns):
            ready = wait([conn, self._procs[rank].sentinel], timeout=max(0.0, deadline - time.monotonic()))
            try:
                if conn not in ready:
                    raise EOFError
                _, watched = conn.recv()
                self._watched.append(watched)
            except (EOFError, OSError):
                tail = self._log_tail(rank, 0)
                self.shutdown()
                raise RuntimeError(f"rank {rank} of the pool did not start: {tail or 'no output'}") from None

    def shutdown(self, *, kill: bool = False) -> None:
        """Stops the workers: politely, or (``kill``, after a failure) at once."""
        for conn in self._conns:
            with contextlib.suppress(OSError, BrokenPipeError):
                conn.send(None)
        for proc in self._procs:
            if kill:
                proc.kill()
            proc.join(timeout=2)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for conn in self._conns + self._stack_conns:
            conn.close()
        self._procs, self._conns, self._stack_conns, self._watched = [], [], [], []
        self.budget.unregister()

    def close(self) -> None:
        """Stops the workers for good and removes their logs and scratch (a case's checkpoint
        left behind when a rank failed between saving and removing it): what a case needed of
        them was read into its outcome. (A pool left behind once wrote a directory per session into the
        shared temporary directory: 2,076 of them on the CI machine after a day.)"""
        self.shutdown()
        shutil.rmtree(self._logdir, ignore_errors=True)
        if self._memory is not None:
            shutil.rmtree(self._memory, ignore_errors=True)

    def _memory_env(self) -> dict[str, str]:
        return {} if self._memory is None else {MEMORY_SCRATCH: self._memory}

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- running a case ---------------------------------------------------------------
    def run(
        self,
        fn: Callable[[RankContext, Any], Any],
        payload: Any = None,
        *,
        world_size: int | None = None,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CaseOutcome:
        """Runs ``fn(ctx, payload)`` on ranks ``0 .. world_size-1``; never raises for a rank's failure.

        ``fn`` must be importable by name (module level). ``env`` (e.g.
        ``TORCH_DISTRIBUTED_DEBUG``) must be set before a process group exists, so the pool
        respawns whenever a case's ``env`` differs from the case before.
        """
        world = self.nproc if world_size is None else world_size
        if not 1 <= world <= self.nproc:
            raise ValueError(f"world_size={world} must be between 1 and the pool's nproc={self.nproc}")
        wanted_env = dict(env or {})
        if self.alive and wanted_env != self._env:
            self.shutdown()
        self._env = wanted_env
        if not self.alive:
            self.start()
        self._next_case += 1
        threads = None if self.devices[0].startswith("cuda") else self.budget.threads()
        job = _Job(self._next_case, world, fn, payload, threads)
        offsets = [self._log_size(r) for r in range(world)]
        start = time.monotonic()
        for rank in range(world):
            self._conns[rank].send(job)
        timeout = timeout_s or self.case_timeout_s
        results, failure, settled = self._collect(world, start, timeout, offsets)
        if failure is not None and not (settled and self._regroup()):
            self.shutdown(kill=True)
        return CaseOutcome(results + [None] * (self.nproc - world), failure, time.monotonic() - start)

    def _regroup(self) -> bool:
        """Every rank destroys its process groups and makes them afresh (``_Regroup``); whether
        each did within ``REGROUP_S``. Only after a case every rank of which returned."""
        self.regroups += 1
        job = _Regroup(f"spawn{self.spawns}-regroup{self.regroups}")
        try:
            for conn in self._conns:
                conn.send(job)
            deadline = time.monotonic() + REGROUP_S
            for rank, conn in enumerate(self._conns):
                ready = wait([conn, self._procs[rank].sentinel], timeout=max(0.0, deadline - time.monotonic()))
                if conn not in ready or conn.recv()[0] != "ready":
                    return False
        except (EOFError, OSError):
            return False
        return True

    def _collect(
        self, world: int, start: float, timeout: float, offsets: list[int]
    ) -> tuple[list[Any], RankFailure | None, bool]:
        """Each rank's result, the case's failure, and whether every rank returned (none hung or died)."""
        results: list[Any] = [None] * world
        pending = set(range(world))
        failure: RankFailure | None = None
        deadline, cap = start + timeout, start + SLOW_CAP * timeout
        # Past the deadline, how long the ranks may show no progress at all before the case is a hang:
        # never under MIN_QUIET_S, the time a descheduled rank needs on a crowded machine to show it.
        quiet_s = min(QUIET_S, max(timeout / 2, MIN_QUIET_S))
        # Under TORCH_DISTRIBUTED_DEBUG=DETAIL the library names a mismatch itself within a
        # fraction of a second, on each rank: a raised error waits for its peers' (below).
        detail = self._env.get("TORCH_DISTRIBUTED_DEBUG") == "DETAIL"
        stall = _Stall(self.stall_s)
        # CPU use tells a progressing gloo rank from a waiting one; a CUDA rank's CPU may spin
        # in a wait for the GPU, so there the stacks alone decide, except where its collectives
        # wait in gloo on the CPU too (the relay of ranks that share a GPU).
        progress = None if self.devices[0].startswith("cuda") and self.backend != RELAY else Progress()
        quiet = None if progress is None else Quiet()
        #: when some rank last progressed: it returned, its stack changed, or it moved bytes or used CPU (``Quiet``)
        progressed = start
        seen: dict[int, str] = {}
        gap = self.sample_after_s
        next_sample = time.monotonic() + gap
        failed_at = 0.0
        while pending:
            by_handle: dict[Any, tuple[str, int]] = {}
            for r in pending:
                by_handle[self._conns[r]] = ("conn", r)
                by_handle[self._procs[r].sentinel] = ("proc", r)
            now = time.monotonic()
            wake = next_sample if now >= deadline else min(deadline, next_sample)
            ready = wait(list(by_handle), timeout=max(0.0, wake - now))
            if not ready:
                dumps = self._stacks(pending)
                moved = progress.moved({r: self._watched[r] for r in pending}) if progress else None
                # A reader that answers late on a crowded machine is no change of the rank's own.
                answered = {r: text for r, text in dumps.items() if text != _BUSY}
                changed = any(r in seen and seen[r] != text for r, text in answered.items())
                seen = {**seen, **answered}
                now = time.monotonic()
                pids = {r: self._watched[r] for r in pending}
                if quiet.progressed(pids, anyway=changed) if quiet is not None else changed:
                    progressed = now
                if failure is not None:
                    # A rank raised. Under DETAIL each rank names its own side of a mismatch, and
                    # a peer that still progresses may be on its way to its error: wait for it a
                    # while. Otherwise, or once peers are stuck in a collective the raiser will
                    # never enter: say where each waits, and stop.
                    waiting = detail and progress is not None and moved is not False
                    if waiting and now < min(failed_at + _PEER_ERROR_S, deadline):
                        next_sample = now + self.sample_after_s
                        continue
                    return results, replace(failure, stacks={**failure.stacks, **dumps}), False
                stuck = stall.observe(dumps, moved=moved)
                if stuck is not None:
                    return results, self._stalled(pending, world, stuck, dumps), False
                if now >= deadline and now - progressed >= quiet_s:
                    return results, self._hang(pending, dumps, quiet_s=now - progressed), False
                if now >= cap:
                    return results, self._hang(pending, dumps), False
                # Every rank in a collective: look again soon; otherwise less and less often.
                gap = self.sample_after_s if stall.suspect else min(2 * gap, _MAX_SAMPLE_GAP_S)
                next_sample = now + gap
                continue
            for handle in ready:
                what, rank = by_handle[handle]
                if rank not in pending:
                    continue
                if what == "conn":
                    try:
                        status, value = self._conns[rank].recv()
                    except (EOFError, OSError):
                        continue  # the process died; its sentinel reports it
                    pending.discard(rank)
                    progressed = time.monotonic()
                    if status == "ok":
                        results[rank] = value
                    elif failure is None:
                        failure, failed_at = RankFailure("error", rank, value), time.monotonic()
                    else:  # a peer's own error often says what the first one could not
                        failure = replace(failure, stacks={**failure.stacks, rank: value})
                    # Peers may now wait in a collective this rank will never enter: look soon.
                    next_sample = min(next_sample, time.monotonic() + self.sample_after_s)
                else:
                    self._procs[rank].join(timeout=1)
                    pending.discard(rank)
                    stacks = self._stacks(pending)
                    tail = self._log_tail(rank, offsets[rank]) or "no output"
                    return results, RankFailure("died", rank, tail, self._procs[rank].exitcode, stacks), False
        return results, failure, True

    def _stalled(self, pending: set[int], world: int, where: dict[int, str], dumps: dict[int, str]) -> RankFailure:
        waiting = "; ".join(f"rank {r} waits in {where[r]}" for r in sorted(where))
        done = sorted(set(range(world)) - pending)
        still = f"none progressed for {self.stall_s:g} s"
        if done:
            why = f"{waiting}, while rank{'s' if len(done) > 1 else ''} {', '.join(map(str, done))} finished the case; {still}"
        elif len(set(where.values())) > 1:
            why = f"{waiting}: no rank can complete its collective; {still}"
        else:
            why = f"{waiting}; {still}"
        return RankFailure("hang", min(pending), why, stacks=dumps, collectives=where)

    def _hang(self, pending: set[int], stacks: dict[int, str], *, quiet_s: float | None = None) -> RankFailure:
        """The case ran past its deadline, and either no rank progressed for ``quiet_s`` or it
        reached ``SLOW_CAP`` times its deadline while some still did; ``stacks`` read just now."""
        rank = min(pending)
        where = {r: c for r, text in stacks.items() if (c := collective(main_thread_frames(text)))}
        if quiet_s is not None:
            why = f"ranks {sorted(pending)} did not finish before the deadline, and none progressed for {quiet_s:.1f} s"
        else:
            why = (
                f"ranks {sorted(pending)} did not finish before the deadline, nor in the {SLOW_CAP:g} times as long "
                "given while they still progressed (the cap)"
            )
        why += "".join(f"; rank {r} waits in {c}" for r, c in sorted(where.items()))
        return RankFailure("hang", rank, why, stacks=stacks, collectives=where)

    def _stacks(self, ranks: set[int]) -> dict[int, str]:
        """Each live rank's main-thread stack, read by its stack reader without interrupting it.

        A rank whose reader does not answer in time (its main thread holds the GIL, in C++ or
        in a loop) is not known to wait in a collective, and is said to be busy."""
        answered = self._reader.read({r: self._stack_conns[r] for r in ranks}, timeout_s=0.2)
        return {r: answered.get(r, _BUSY) for r in sorted(ranks)}

    # -- logs ---------------------------------------------------------------------------
    def _log_size(self, rank: int) -> int:
        try:
            return os.path.getsize(self._logs[rank])
        except OSError:
            return 0

    def _log_tail(self, rank: int, offset: int, limit: int = 8000) -> str:
        """What rank ``rank`` wrote since ``offset``: its last ``limit`` characters, each thread's
        frames its own (``own_frames``), led by why it was killed where that was cut off."""
        try:
            with open(self._logs[rank], errors="replace") as f:
                f.seek(offset)
                text = own_frames(f.read())
        except OSError:
            return ""
        said = crash_said(text)
        tail = text[-limit:]
        return tail if said is None or said in tail else f"{said}\n…\n{tail}"
