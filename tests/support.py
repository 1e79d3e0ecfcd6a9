"""What the tests that start programs of their own share: where this checkout is, and how
those programs reach it."""

from __future__ import annotations

import os
from pathlib import Path

#: this checkout: the programs a test starts import muongate from here
REPO = Path(__file__).resolve().parents[1]


def pythonpath(*first: Path | str) -> str:
    """``FIRST…``, then this checkout, then the caller's own ``PYTHONPATH``."""
    inherited = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join([*map(str, first), str(REPO), *([inherited] if inherited else [])])


def repo_env(*first: Path | str, **extra: str) -> dict[str, str]:
    """This process's environment, with ``pythonpath(*first)`` and ``extra`` set."""
    return {**os.environ, "PYTHONPATH": pythonpath(*first), **extra}
