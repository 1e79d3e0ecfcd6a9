"""What a run says about itself in its header: muongate's own commit and the versions around it."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from reports.records import Header

_CHECKOUT = Path(__file__).resolve().parents[1]


def muongate_version() -> str:
    """The version of the muongate code that runs (``harness.__version__``), installed or not."""
    from harness import __version__

    return __version__


def muongate_commit() -> str:
    """The commit of the muongate checkout this code was imported from, wherever pytest runs;
    ``unknown`` for an install that is not a git checkout."""
    if not (_CHECKOUT / ".git").exists():
        return "unknown"
    try:
        out = subprocess.run(
            ["git", "-C", str(_CHECKOUT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
        )
        dirty = subprocess.run(
            ["git", "-C", str(_CHECKOUT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = out.stdout.strip()
    if not commit:
        return "unknown"
    return commit + ("+changes" if dirty.stdout.strip() else "")


def make_header(*, backend: str, devices: list[str], nproc: int, **fields: Any) -> Header:
    """The one header of a results stream (gates and ``python -m harness.train`` alike)."""
    import torch

    return Header(
        muongate=muongate_version(),
        git_commit=muongate_commit(),
        torch=torch.__version__,
        backend=backend,
        device=devices[0].split(":")[0],
        devices=tuple(devices),
        nproc=nproc,
        time=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **fields,
    )
