"""Running cases on ranks started by ``torchrun`` instead of the rank pool.

Under ``torchrun`` every rank runs the same pytest session. Hypothesis is derandomized
and its database is off, so every rank draws the same examples in the same order; each
case is still broadcast from rank 0 and checked against the local draw, so a rank that
drifts is a clear error rather than a silent mismatch. Every rank runs the case (ranks
past the case's world size sit it out), the verdicts are gathered to every rank, and all
ranks raise or pass together, which keeps their hypothesis runs in step. Only rank 0
writes the report.

Unlike the pool, a rank that hangs or dies cannot be replaced here: the process group's
timeout (``--case-timeout``) turns a hang into an error on the waiting ranks, and
torchrun ends the job when a rank dies.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from harness.ranks.context import CaseOutcome, RankContext, RankFailure, make_groups


def launched_by_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"))


class LauncherGroup:
    """The launcher's ranks as an executor with the pool's ``run`` contract."""

    def __init__(self, *, backend: str, device: str, timeout_s: float, grids: tuple[tuple[int, ...], ...] = ()) -> None:
        import torch
        import torch.distributed as dist

        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))
        if not dist.is_initialized():
            # Binding the device up front keeps NCCL from guessing it (and warning at every barrier).
            device_id = torch.device(device) if device.startswith("cuda") else None
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), device_id=device_id)
        self.rank = dist.get_rank()
        self.nproc = dist.get_world_size()
        self.backend = backend
        self.device = device
        self._groups = make_groups(self.nproc, grids)
        self._next_case = 0

    def run(
        self, fn: Callable[[RankContext, Any], Any], payload: Any = None, *, world_size: int | None = None
    ) -> CaseOutcome:
        import torch.distributed as dist

        world = self.nproc if world_size is None else world_size
        if not 1 <= world <= self.nproc:
            raise ValueError(f"world_size={world} must be between 1 and the launcher's world size {self.nproc}")
        self._next_case += 1
        sent = [payload]
        dist.broadcast_object_list(sent, src=0)
        start = time.monotonic()
        status, value = "idle", None
        if sent[0] != payload:
            status, value = "error", f"rank {self.rank} drew a different case than rank 0: {payload!r} vs {sent[0]!r}"
        elif self.rank < world:
            ctx = self._groups.context(self.rank, world, self.device, self.backend, self._next_case)
            try:
                status, value = "ok", fn(ctx, payload)
            except Exception:
                status, value = "error", traceback.format_exc()
        gathered: list[Any] = [None] * self.nproc
        dist.all_gather_object(gathered, (status, value))
        failure = next(
            (RankFailure("error", r, v) for r, (s, v) in enumerate(gathered) if s == "error"),
            None,
        )
        results = [v if s == "ok" else None for s, v in gathered]
        return CaseOutcome(results, failure, time.monotonic() - start)

    def close(self) -> None:
        """Ends the session's process group, once every rank is done (the pool's ``close``)."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
