"""What a rank task knows about where it runs, and what comes back from running a case.

Shared by the pool (``harness.ranks.pool``) and the torchrun launcher
(``harness.ranks.launcher``), which run cases under the same contract.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

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
    hsdp_groups: Mapping[tuple[int, int], tuple[Any, Any]] = field(default_factory=dict, compare=False, repr=False)


def make_groups(nproc: int) -> tuple[dict[int, Any], dict[tuple[int, int], tuple[Any, Any]]]:
    """Every process group a case can need, made once (every rank must take part in each).

    Returns the group of ranks ``0 .. w-1`` for every world size ``w``, and for every even
    ``w >= 4`` this rank's (replicate, shard) groups of the HSDP mesh ``(2, w // 2)`` laid
    over ranks ``0 .. w-1`` (rows shard, columns replicate); ranks outside get placeholders.
    """
    import torch.distributed as dist

    rank = dist.get_rank()
    worlds: dict[int, Any] = {w: dist.new_group(list(range(w))) for w in range(1, nproc)}
    worlds[nproc] = dist.group.WORLD
    hsdp: dict[tuple[int, int], tuple[Any, Any]] = {}
    for w in range(4, nproc + 1, 2):
        half = w // 2
        rows = [dist.new_group(list(range(r * half, (r + 1) * half))) for r in range(2)]
        cols = [dist.new_group([c, c + half]) for c in range(half)]
        if rank < w:
            hsdp[(2, half)] = (cols[rank % half], rows[rank // half])
    return worlds, hsdp


@dataclass(frozen=True)
class RankFailure:
    """Why a case did not complete: which rank, how, and what each rank was doing."""

    kind: FailureKind
    rank: int
    message: str
    exitcode: int | None = None
    stacks: Mapping[int, str] = field(default_factory=dict)

    def describe(self) -> str:
        head = f"rank {self.rank} {self.kind}"
        if self.exitcode is not None:
            head += f" (exit code {self.exitcode}{_signal_name(self.exitcode)})"
        parts = [f"{head}: {self.message}"]
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


def _signal_name(exitcode: int) -> str:
    if exitcode < 0:
        with contextlib.suppress(ValueError):
            return f", {signal.Signals(-exitcode).name}"
    return ""
