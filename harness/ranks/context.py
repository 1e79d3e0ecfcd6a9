"""What a rank task knows about where it runs, and what comes back from running a case.

Shared by the pool (``harness.ranks.pool``) and the torchrun launcher
(``harness.ranks.launcher``), which run cases under the same contract.
"""

from __future__ import annotations

import contextlib
import math
import re
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from harness.ranks.stacks import crash_cause

FailureKind = Literal["error", "hang", "died"]


@dataclass(frozen=True)
class RankContext:
    """What a task running on one rank knows about where it runs.

    ``group`` is the case's process group (ranks ``0 .. world_size-1`` of the pool); tasks
    pass it to every collective, never the default group, which also holds idle ranks.
    """

    rank: int
    world_size: int
    device: str
    backend: str
    case_id: int
    group: Any = field(default=None, compare=False, repr=False)
    #: this rank's group on each dim of every multi-dim mesh shape (``grid_shapes``)
    grid_groups: Mapping[tuple[int, ...], tuple[Any, ...]] = field(default_factory=dict, compare=False, repr=False)
    #: this rank alone: where a candidate runs as its own single-device self (``--against self``)
    solo_group: Any = field(default=None, compare=False, repr=False)
    #: the group of ranks ``0 .. w-1`` for every ``w`` this rank is in (a case that changes world size)
    world_groups: Mapping[int, Any] = field(default_factory=dict, compare=False, repr=False)


class Groups(NamedTuple):
    """Every process group a case can need on this rank (``make_groups``)."""

    worlds: dict[int, Any]
    grids: dict[tuple[int, ...], tuple[Any, ...]]
    solo: Any

    def context(self, rank: int, world: int, device: str, backend: str, case_id: int) -> RankContext:
        """The context of one case of ``world`` ranks, on this rank."""
        mine = {w: g for w, g in self.worlds.items() if rank < w}
        return RankContext(rank, world, device, backend, case_id, self.worlds[world], self.grids, self.solo, mine)

    def mine(self, rank: int) -> list[Any]:
        """The groups of ranks ``0 .. w-1`` and of the grids that this rank belongs to (to warm up)."""
        return [g for w, g in self.worlds.items() if rank < w] + [g for dims in self.grids.values() for g in dims]


def grid_shapes(nproc: int, extra: Iterable[tuple[int, ...]] = ()) -> list[tuple[int, ...]]:
    """The multi-dim meshes cases are laid on: ``(2, w // 2)`` for every even ``w >= 4`` (HSDP,
    FSDP2 × TP, EP × EFSDP) and ``(2, 2, w // 4)`` for every ``w >= 8`` that 4 divides (HSDP × TP);
    and the ``extra`` ones of at most ``nproc`` ranks (a replayed capture's)."""
    shapes: list[tuple[int, ...]] = [(2, w // 2) for w in range(4, nproc + 1, 2)]
    shapes += [(2, 2, w // 4) for w in range(8, nproc + 1, 4)]
    return shapes + sorted({s for s in extra if s not in shapes and math.prod(s) <= nproc})


def make_groups(nproc: int, extra: Iterable[tuple[int, ...]] = (), backend: str | None = None) -> Groups:
    """Every process group a case can need, made once (every rank must take part in each).

    The group of ranks ``0 .. w-1`` for every world size ``w``; for every mesh shape of
    ``grid_shapes`` (with ``extra``), laid row-major over ranks ``0 .. w-1``, this rank's group on each of its
    dims (ranks outside the mesh take part in making them but keep none); and the group of
    this rank alone. ``backend``: the groups' (default: the default group's).
    """
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    worlds: dict[int, Any] = {w: dist.new_group(list(range(w)), backend=backend) for w in range(1, nproc)}
    worlds[nproc] = dist.group.WORLD if backend is None else dist.new_group(list(range(nproc)), backend=backend)
    grids: dict[tuple[int, ...], tuple[Any, ...]] = {}
    for shape in grid_shapes(nproc, extra):
        ranks = torch.arange(math.prod(shape)).view(shape)
        dims = []
        for d, size in enumerate(shape):
            lines = ranks.movedim(d, -1).reshape(-1, size).tolist()
            made = [
                dist.new_group(line, backend=backend) for line in lines
            ]  # every rank makes every group, in one order
            dims += [g for g, line in zip(made, lines, strict=True) if rank in line]
        if rank < ranks.numel():
            grids[shape] = tuple(dims)
    solos = (
        [worlds[1] if r == 0 else dist.new_group([r], backend=backend) for r in range(nproc)]
        if nproc > 1
        else [worlds[1]]
    )
    return Groups(worlds, grids, solos[rank])


#: What a failed case is called, from its ranks: stuck in a collective (``hang``); ranks that
#: disagreed about a collective and were caught at it (``collective mismatch``: gloo's size
#: check aborting a rank, or the ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` wrapper); a rank killed
#: by a signal for another reason (``abort``); an exception (``error``).
FailureStatus = Literal["hang", "collective mismatch", "abort", "error"]

_MISMATCH = ("doesn't match expected size", "op.preamble.length <= op.nbytes", "Detected mismatch between collectives")
_TIMEOUT = ("Timed out waiting", "Watchdog caught collective operation timeout")
_HARNESS = ("/harness/", "/torch/", "/multiprocessing/", "<frozen")
_TRACEBACK_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)', re.MULTILINE)


@dataclass(frozen=True)
class RankFailure:
    """Why a case did not complete: which rank, how, and what each rank was doing.

    ``collectives``: the collective each stuck rank waits in (``harness.ranks.stacks``)."""

    kind: FailureKind
    rank: int
    message: str
    exitcode: int | None = None
    stacks: Mapping[int, str] = field(default_factory=dict)
    collectives: Mapping[int, str] = field(default_factory=dict)

    @property
    def status(self) -> FailureStatus:
        text = "\n".join([self.message, *self.stacks.values()])
        if self.kind == "hang":
            return "hang"
        if any(m in text for m in _MISMATCH):
            return "collective mismatch"
        if self.kind == "died":
            return "abort"
        return "hang" if any(t in self.message for t in _TIMEOUT) else "error"

    @property
    def signature(self) -> str:
        """What makes two crashes the same for shrinking: any hang (where the peers wait depends
        on the case); an exception's type and the frame that raised it; otherwise the headline,
        numbers left out."""
        if self.status == "hang":
            return "hang"
        if self.kind == "error":
            exception, where = self._raised()
            return f"error: {exception.split(':', 1)[0]}{where}"
        return re.sub(r"\d+", "N", self.headline())

    def _raised(self) -> tuple[str, str]:
        """An error's exception line, and `` at file:line in func`` of the innermost frame outside
        the harness and torch (the candidate's own), or ``""``."""
        lines = [ln for ln in self.message.strip().splitlines() if ln.strip()]
        frames = [m for m in _TRACEBACK_FRAME.finditer(self.message) if not any(h in m["file"] for h in _HARNESS)]
        where = (
            f" at {frames[-1]['file'].rsplit('/', 1)[-1]}:{frames[-1]['line']} in {frames[-1]['func']}"
            if frames
            else ""
        )
        return (lines[-1] if lines else "an exception"), where

    def headline(self) -> str:
        """One line: what happened, and where (the candidate's own frame first, for an error)."""
        if self.kind == "error":
            exception, where = self._raised()
            return f"{self.status} on rank {self.rank}: {exception}{where}"
        if self.kind == "died":
            # The log's last line is what Python prints on a fatal signal (the extension modules
            # it had loaded); the C++ side's reason comes before that report.
            reason = next(
                (ln.strip() for ln in self.message.splitlines() if any(m in ln for m in _MISMATCH)),
                crash_cause(self.message) or _last_line(self.message),
            )
            return f"{self.status}: rank {self.rank} was killed (exit code {self.exitcode}{_signal_name(self.exitcode or 0)}): {reason[:300]}"
        return f"{self.status}: {self.message}"

    def describe(self) -> str:
        parts = [self.headline()]
        if self.kind != "hang":
            parts.append(f"--- rank {self.rank} ---\n{self.message.rstrip()}")
        for rank, text in sorted(self.stacks.items()):
            if text.strip():
                parts.append(f"--- rank {rank} ---\n{text.rstrip()}")
        return "\n".join(parts)


@dataclass(frozen=True)
class CaseOutcome:
    """Per-rank return values (``None`` for ranks outside the case's world) or a failure."""

    results: list[Any]
    failure: RankFailure | None
    seconds: float

    @property
    def ok(self) -> bool:
        return self.failure is None


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("Extension modules:")]
    return lines[-1] if lines else "no output"


def _signal_name(exitcode: int) -> str:
    if exitcode < 0:
        with contextlib.suppress(ValueError):
            return f", {signal.Signals(-exitcode).name}"
    return ""
