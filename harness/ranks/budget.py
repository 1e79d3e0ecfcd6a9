"""How many threads each CPU rank may use, counting every rank of every pool on the host.

A pool alone on a machine would give each of its ranks ``cores // nproc`` threads. But pools
share machines: pytest-xdist workers each run one, CI runners and GPU hosts run several
jobs at once, and OpenMP threads that outnumber the cores do not just share them, they spin
against each other (two concurrent runs took 4× as long as one, three stalled). So each pool
registers its ranks in a directory every pool on the host can see, one file per pool, and
before each case a rank's thread count is the usable cores over the live ranks of every
registered pool (at least 1). A pool whose process died is not counted: its file names a pid
that no longer runs.

A user's ``OMP_NUM_THREADS``, or the pool's ``threads`` argument (the plug-in's
``--rank-threads``), fixes the count instead.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

#: where pools register; per user, so that another user's runs neither count nor can be written
REGISTRY = Path(tempfile.gettempdir()) / f"muongate-ranks-{os.getuid() if hasattr(os, 'getuid') else 'user'}"


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, bounded by a cgroup v2 CPU quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    return max(1, cores)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ThreadBudget:
    """One pool's entry in the host's registry, and the thread count it gives each rank."""

    def __init__(self, ranks: int, *, threads: int | None = None, registry: Path = REGISTRY) -> None:
        if threads is not None and threads < 1:
            raise ValueError(f"threads={threads} must be at least 1")
        omp = os.environ.get("OMP_NUM_THREADS", "")
        self.fixed = threads if threads is not None else int(omp) if omp.isdigit() and int(omp) > 0 else None
        self.ranks = ranks
        self.registry = registry
        self._entry: Path | None = None

    def register(self) -> None:
        if self._entry is not None:
            return
        with contextlib.suppress(OSError):
            self.registry.mkdir(mode=0o700, exist_ok=True)
            entry = self.registry / f"{os.getpid()}-{id(self):x}"
            entry.write_text(str(self.ranks))
            self._entry = entry

    def unregister(self) -> None:
        if self._entry is not None:
            with contextlib.suppress(OSError):
                self._entry.unlink()
            self._entry = None

    def host_ranks(self) -> int:
        """Live ranks of every registered pool on the host, this one's included."""
        total = 0 if self._entry is not None else self.ranks
        with contextlib.suppress(OSError):
            for entry in self.registry.iterdir():
                pid = entry.name.split("-", 1)[0]
                with contextlib.suppress(OSError, ValueError):
                    if pid.isdigit() and _alive(int(pid)):
                        total += int(entry.read_text() or 0)
                    elif pid.isdigit():
                        entry.unlink()  # a pool whose process died without unregistering
        return max(total, self.ranks)

    def threads(self) -> int:
        """Each rank's thread count now: fixed, or the usable cores over the host's live ranks."""
        if self.fixed is not None:
            return self.fixed
        return max(1, usable_cores() // self.host_ranks())
