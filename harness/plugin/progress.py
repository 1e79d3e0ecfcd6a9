"""A live count of cases per gate on the terminal of a person watching (not CI)."""

from __future__ import annotations

import os
from typing import Any


def terminal() -> Any:
    """The controlling terminal of a person watching (not CI), or ``None``.

    pytest captures file descriptors 1 and 2 while tests run, so a live display during a
    test must write to the terminal device itself.
    """
    if os.environ.get("CI"):
        return None
    try:
        return open("/dev/tty", "w")  # closed by CaseProgress.stop
    except OSError:
        return None


class CaseProgress:
    """Cases and failures per gate, updated as each case ends; gone when the run is done."""

    def __init__(self, tty: Any) -> None:
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TextColumn("{task.completed} cases, {task.fields[failed]} failed"),
            TimeElapsedColumn(),
            console=Console(file=tty, force_terminal=True, emoji=False),
            transient=True,
        )
        self._tty = tty
        self._tasks: dict[str, Any] = {}

    @classmethod
    def start(cls, tty: Any) -> CaseProgress:
        progress = cls(tty)
        progress._progress.start()
        return progress

    def __call__(self, gate: str, passed: bool) -> None:
        if gate not in self._tasks:
            self._tasks[gate] = self._progress.add_task(gate, total=None, failed=0)
        task = self._tasks[gate]
        failed = self._progress.tasks[task].fields["failed"] + (not passed)
        self._progress.update(task, advance=1, failed=failed)

    def stop(self) -> None:
        self._progress.stop()
        self._tty.close()
