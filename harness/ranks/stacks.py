"""Reading a rank's Python stack (a ``faulthandler`` dump) for what it is waiting in.

A rank that sits in a collective which cannot complete is a hang, and the report should
say which collective: a ``torch.distributed`` call that blocks (``all_gather_into_tensor``,
``barrier``, a work's ``wait``) among the innermost frames, and the first frame outside
torch says who called it (the candidate's file and line, most often).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_BLOCKING = frozenset(
    {
        "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "_all_gather_base",
        "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "all_to_all", "all_to_all_single",
        "broadcast", "broadcast_object_list", "barrier", "monitored_barrier", "send", "recv", "gather",
        "scatter", "reduce", "batch_isend_irecv", "gather_object", "scatter_object_list",
    }
)  # fmt: skip


#: Frames of decorators, which name nothing the caller called.
_DECORATORS = frozenset({"wrapper", "inner", "_fn", "decorate_context"})


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    @property
    def where(self) -> str:
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line} in {self.func}"


def main_thread_frames(dump: str, marker: str = "_worker_main") -> list[Frame]:
    """The frames (innermost first) of the last dumped thread that runs ``marker``: the rank's
    main thread, which runs the case."""
    blocks: list[list[Frame]] = []
    for line in dump.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            blocks.append([])
        elif blocks and (m := _FRAME.match(line)):
            blocks[-1].append(Frame(m["file"], int(m["line"]), m["func"]))
    for frames in reversed(blocks):
        if any(f.func == marker for f in frames):
            return frames
    return []


def own_frames(dump: str, marker: str = "_worker_main") -> str:
    """A ``faulthandler`` dump with each thread's frames cut after ``marker``, and without the list
    of extension modules Python appends on a fatal signal.

    A rank is forked from the forkserver, which may itself be a fork of the gate session
    (``harness.ranks.forkserver``): frames older than the rank's ``_worker_main`` are those of
    whatever gate first started a pool, not the rank's, and pushed the rank's own lines (gloo's
    reason for aborting it) out of the log's tail. The module list names every C extension loaded and
    says nothing about the rank."""
    kept: list[str] = []
    cut = False
    for line in dump.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            cut = False
        elif m := _FRAME.match(line):
            if cut:
                continue
            cut = m["func"] == marker
        elif line.startswith("Extension modules:"):
            continue
        kept.append(line)
    return "\n".join(kept) + ("\n" if dump.endswith("\n") else "")


#: what Python's ``faulthandler`` prints first when a signal kills the process
_FATAL = "Fatal Python error: "
#: a line of the C++ side that says why it aborted (gloo's ``what():``, std::terminate's, an assertion)
_SAID = re.compile(r"what\(\):|terminate called|[Ee]rror|[Ee]xception|[Aa]ssert|[Aa]bort|mismatch|doesn't match")


def crash_said(log: str) -> str | None:
    """The C++ side's own words for why it aborted the rank, which come before Python's
    fatal-signal report (gloo's ``what(): … Received data size doesn't match expected size``);
    ``None`` where it said nothing, or the log has no such report."""
    lines = log.splitlines()
    fatal = next((i for i, ln in enumerate(lines) if ln.startswith(_FATAL)), len(lines))
    said = [ln.strip() for ln in lines[:fatal] if _SAID.search(ln) and not _FRAME.match(ln)]
    # std::terminate says which exception, its ``what()`` what the exception said.
    what = [ln for ln in said if ln.startswith("what():")]
    return (what or said)[-1] if fatal < len(lines) and (what or said) else None


def crash_cause(log: str) -> str | None:
    """Why a rank was killed, from its log: the C++ side's words (``crash_said``), else the first
    line of Python's fatal-signal report and the rank's innermost frame; ``None`` for a log
    without that report."""
    said = crash_said(log)
    if said is not None:
        return said
    lines = log.splitlines()
    fatal = next((i for i, ln in enumerate(lines) if ln.startswith(_FATAL)), None)
    if fatal is None:
        return None
    frames = main_thread_frames("\n".join(lines[fatal:]))
    return lines[fatal].strip() + (f" in {frames[0].where}" if frames else "")


def collective(frames: list[Frame]) -> str | None:
    """``"wait_tensor in full_tensor, called from placement.py:76 in gather_full"`` when the rank
    blocks in ``torch.distributed``; ``None`` when it is doing anything else.

    Only the innermost run of frames inside torch counts (dispatch and autograd frames sit
    below a collective's wait): the rank is in a collective if the innermost
    ``torch.distributed`` frame of that run is a blocking call. (Not any frame of it: the
    distributed checkpoint's own ``reduce_scatter`` helper runs each rank's local step, file
    reads included, before its collective, and a rank busy there is not waiting.) The
    outermost ``torch.distributed`` frame of that run names the API that was called, and the
    first frame outside torch says who called it. The relay's frames count as torch's."""
    inner = [f for f in _leading(frames, lambda f: "/torch/" in f.file or _relayed(f))]
    blocking = next((f for f in inner if "/torch/distributed/" in f.file or _relayed(f)), None)
    if blocking is None or not _blocks(blocking):
        return None
    # the outermost public frame of torch.distributed; a group's own method where the relay was
    # called from outside torch (a subclass of it, say)
    apis = [f for f in inner if "/torch/distributed/" in f.file and f.func not in _DECORATORS]
    api = apis[-1] if apis else inner[-1]
    caller = frames[len(inner)] if len(inner) < len(frames) else None
    return (
        blocking.func
        + (f" in {api.func}" if api is not blocking else "")
        + (f", called from {caller.where}" if caller else "")
    )


def _blocks(f: Frame) -> bool:
    """A frame that waits for peers: any public function of the collectives' module (their
    names change between torch versions: ``all_gather_single`` is 2.13's), a known
    collective, or a wait. Not that module's private helpers: ``_tensor_to_object``
    unpickles what a broadcast brought, on this rank alone."""
    if _relayed(f):
        return True  # the relay (a process group) waits for its gloo group in every method
    if "/torch/distributed/" not in f.file:
        return False
    public_c10d = f.file.endswith("distributed_c10d.py") and not f.func.startswith("_")
    return public_c10d or f.func in _BLOCKING or "wait" in f.func.lower()


def _relayed(f: Frame) -> bool:
    """A frame of the relay, the process group through which ranks share a GPU
    (``harness.ranks.relay``): communication, as torch's own collectives are."""
    return f.file.endswith("/harness/ranks/relay.py")


def _leading(frames: list[Frame], inside: Callable[[Frame], bool]) -> list[Frame]:
    out = []
    for f in frames:
        if not inside(f):
            break
        out.append(f)
    return out
