"""Watching a running rank without interrupting it: its main thread's stack, and whether it progresses.

**Stacks.** Each rank runs a small thread that, when the parent asks, reads the main
thread's stack in one call into C while it holds the GIL (``main_stack`` says why that, and
not the obvious ways, is safe) and answers in ``faulthandler``'s format, which
``harness.ranks.stacks`` parses. Nothing is delivered to a running rank as a signal: the
pool once dumped every thread from a ``SIGUSR1`` handler, in the middle of whatever the rank
was doing, and that killed ranks now and then. A collective's wait (gloo's and NCCL's)
releases the GIL, so a rank waiting in one always answers; a rank whose main thread holds
the GIL does not answer in time, is not known to wait in a collective, and so is never
called hung for it (its case's deadline still bounds it).

**Progress.** Ranks that all sit in collectives with the same stacks may still progress: on a
2-D mesh two ranks can loop over all-reduces on their own sub-group while the others wait on
another group, and a stack read between two of those all-reduces looks the same each time.
A collective in progress moves bytes, and reducing them takes CPU; a rank that waits for a
peer sleeps. So the parent reads, from ``/proc``, each pending rank's bytes read and
written, its CPU time, and whether a thread of it is runnable (all but the stack reader's;
gloo's idle transport thread wakes every few milliseconds, so its being runnable says
nothing): a rank that moved bytes, used more than a quarter of a core, or is runnable but
descheduled on a busy machine, progresses, and ranks are only ever called stuck while none
of them does. Where ``/proc`` is missing (not Linux) nothing is known, and the stacks alone
decide.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import operator
import os
import sys
import threading
import time
from multiprocessing.connection import Connection, wait
from pathlib import Path
from types import FrameType
from typing import Any, cast

#: one frame's file, line and function, read in C
_FIELDS = operator.attrgetter("f_code.co_filename", "f_lineno", "f_code.co_name")


def main_stack(main: int, root: FrameType | None = None) -> str:
    """The stack of thread ``main`` (a thread that is not this one), in ``faulthandler``'s format,
    from its innermost frame out to ``root`` where that frame is on it: a rank's frames older
    than its ``_worker_main`` are the forkserver's, inherited from whatever started the server
    (``harness.ranks.forkserver``), and say nothing of the rank.

    The frames are read while this thread holds the GIL, and the walk along ``f_back`` is one
    call into C (``list`` over ``accumulate`` of ``getattr``), during which no bytecode of ours
    runs, so the GIL cannot pass to ``main``, which would pop the frames the walk is about to
    read. The garbage collector is off for that call: a collection could run a Python
    finalizer, and with it the eval loop, which may hand the GIL over. What was measured
    with the pool sampling every 2 ms (CPython 3.11, the training and MoE gates): a walk in
    Python (``f = f.f_back`` in a loop) died in ``PyFrame_GetBack`` in 1 of 6 runs, and
    ``faulthandler.dump_traceback(all_threads=True)`` in 1 of 5, in ``dump_traceback`` of a
    thread state that a C++ thread was creating (``pybind11::gil_scoped_acquire``) while the
    dump walked the interpreter's threads without the lock that ``sys._current_frames``
    takes. A ``SIGUSR1`` handler that dumps from wherever the rank is interrupted, as the
    pool once did, has both hazards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        top = sys._current_frames().get(main)
        frames = list(
            itertools.takewhile(operator.truth, itertools.accumulate(itertools.repeat("f_back"), getattr, initial=top))
        )
    finally:
        if enabled:
            gc.enable()
    ends = [i for i, f in enumerate(frames) if f is root]
    rows = list(map(_FIELDS, frames[: ends[0] + 1] if ends else frames))
    lines = [f"Current thread 0x{main:016x} (most recent call first):"]
    lines += [f'  File "{file}", line {line} in {func}' for file, line, func in rows]
    return "\n".join(lines) + "\n"


def serve_stacks(conn: Connection, root: FrameType | None = None) -> int:
    """Starts the rank's stack reader on ``conn``, which reads the main thread's frames out to
    ``root`` (``main_stack``); returns its native thread id (its CPU is not the rank's)."""
    main = threading.main_thread().ident
    assert main is not None
    started = threading.Event()
    native: list[int] = []

    def serve() -> None:
        native.append(threading.get_native_id())
        started.set()
        while True:
            try:
                asked = conn.recv()
            except (EOFError, OSError):
                return
            text = main_stack(main, root)
            with contextlib.suppress(OSError, BrokenPipeError):
                conn.send((asked, text))

    threading.Thread(target=serve, name="muongate-stacks", daemon=True).start()
    started.wait()
    return native[0]


class StackReader:
    """The parent's side: asks ranks for their stacks and waits a little for the answers."""

    def __init__(self) -> None:
        self._asked = 0

    def read(self, conns: dict[int, Connection], timeout_s: float) -> dict[int, str]:
        """The main-thread stack of each rank that answers within ``timeout_s``."""
        self._asked += 1
        live: dict[Any, int] = {}
        for rank, conn in conns.items():
            with contextlib.suppress(OSError, BrokenPipeError):
                conn.send(self._asked)
                live[conn] = rank
        stacks: dict[int, str] = {}
        give_up = time.monotonic() + timeout_s
        while live and (left := give_up - time.monotonic()) > 0:
            for ready in wait(list(live), timeout=left):
                rank = live.pop(ready)
                try:
                    asked, text = cast(Connection, ready).recv()
                except (EOFError, OSError):
                    continue
                if asked == self._asked:
                    stacks[rank] = text
                else:  # the answer to an earlier question, which came too late: wait on
                    live[ready] = rank
        return stacks


def activity(pid: int, skip_tid: int | None = None) -> tuple[int, int, bool] | None:
    """``(CPU ns, bytes read and written, a thread running)`` of a process so far, from
    ``/proc``; ``None`` where that cannot be read. The thread ``skip_tid`` (the stack reader,
    whose answers are no progress of the rank's) is left out. gloo's transport threads
    (``gloo_tcp_loop``) wake every few milliseconds while idle, so their being runnable says
    nothing; the bytes they move do."""
    tasks = Path(f"/proc/{pid}/task")
    try:
        tids = os.listdir(tasks)
    except OSError:
        return None
    used, moved, running = 0, 0, False
    for tid in tids:
        if skip_tid is not None and tid == str(skip_tid):
            continue
        try:
            head, fields = (tasks / tid / "stat").read_text().rsplit(")", 1)
            used += int((tasks / tid / "schedstat").read_text().split()[0])
            io = dict(line.split(": ") for line in (tasks / tid / "io").read_text().splitlines())
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
        moved += int(io["rchar"]) + int(io["wchar"])
        running = running or (fields.split()[0] == "R" and not head.endswith("(gloo_tcp_loop"))
    return used, moved, running


class Progress:
    """Whether any of a set of ranks progressed since the last look (``activity``): it moved
    bytes, used more than ``busy`` of a core's time, or has a thread runnable (descheduled on
    a busy machine, it may be the one the others wait for)."""

    def __init__(self, busy: float = 0.25) -> None:
        self.busy = busy
        self._last: dict[int, tuple[int, int]] = {}
        self._at = 0.0

    def moved(self, pids: dict[int, tuple[int, int | None]]) -> bool | None:
        """``pids``: rank → (pid, stack reader's tid). ``True`` when a rank progressed since the
        last call, ``False`` when none did, ``None`` when nothing can be known (the first
        look, or no ``/proc``)."""
        now = time.monotonic()
        states = {r: activity(pid, tid) for r, (pid, tid) in pids.items()}
        before, window, self._at = self._last, now - self._at, now
        known = {r: state for r, state in states.items() if state is not None}
        self._last = {r: (used, moved) for r, (used, moved, _) in known.items()}
        if len(known) < len(states) or set(before) != set(known):
            return None
        budget = self.busy * window * 1e9
        return any(
            running or moved > before[r][1] or used - before[r][0] > budget
            for r, (used, moved, running) in known.items()
        )


class Quiet:
    """Whether any of a set of ranks progressed since the last time one did: moved a byte, or used
    more than ``cpu_s`` of CPU in all since then (``activity``).

    ``Progress`` judges each gap between two looks, a few tenths of a second, where a runnable
    thread must count: a rank descheduled that long may be the one the others wait for. Over the
    seconds a case may sit still past its deadline, what it adds up to counts instead: a rank
    that gets any share of a crowded machine uses more than ``cpu_s`` in that time; a rank that
    only waits uses a fraction of a millisecond a second (gloo's transport thread waking)."""

    def __init__(self, cpu_s: float = 0.1) -> None:
        self.cpu_ns = cpu_s * 1e9
        self._mark: dict[int, tuple[int, int]] = {}

    def progressed(self, pids: dict[int, tuple[int, int | None]], *, anyway: bool = False) -> bool:
        """``pids``: rank → (pid, stack reader's tid). ``anyway``: progress seen otherwise (a stack
        that changed); the marks move to now. A rank first seen, or one whose ``/proc`` cannot
        be read, shows none."""
        now: dict[int, tuple[int, int]] = {}
        for r, (pid, tid) in pids.items():
            if (state := activity(pid, tid)) is not None:
                now[r] = state[:2]
        grew = anyway or any(
            r in self._mark and (used - self._mark[r][0] > self.cpu_ns or moved > self._mark[r][1])
            for r, (used, moved) in now.items()
        )
        self._mark = now if grew else {**now, **{r: m for r, m in self._mark.items() if r in now}}
        return grew
