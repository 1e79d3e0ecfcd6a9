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


def collective(frames: list[Frame]) -> str | None:
    """``"wait_tensor in full_tensor, called from placement.py:76 in gather_full"`` when the rank
    blocks in ``torch.distributed``; ``None`` when it is doing anything else.

    Only the innermost run of frames inside torch counts (dispatch and autograd frames sit
    below a collective's wait): the rank is in a collective if the innermost
    ``torch.distributed`` frame of that run is a blocking call. (Not any frame of it: the
    distributed checkpoint's own ``reduce_scatter`` helper runs each rank's local step, file
    reads included, before its collective, and a rank busy there is not waiting.) The
    outermost ``torch.distributed`` frame of that run names the API that was called, and the
    first frame outside torch says who called it."""
    inner = [f for f in _leading(frames, lambda f: "/torch/" in f.file)]
    blocking = next((f for f in inner if "/torch/distributed/" in f.file), None)
    if blocking is None or not _blocks(blocking):
        return None
    api = [f for f in inner if "/torch/distributed/" in f.file and f.func not in _DECORATORS][-1]
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
    if "/torch/distributed/" not in f.file:
        return False
    public_c10d = f.file.endswith("distributed_c10d.py") and not f.func.startswith("_")
    return public_c10d or f.func in _BLOCKING or "wait" in f.func.lower()


def _leading(frames: list[Frame], inside: Callable[[Frame], bool]) -> list[Frame]:
    out = []
    for f in frames:
        if not inside(f):
            break
        out.append(f)
    return out
