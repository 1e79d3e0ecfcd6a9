"""What a run says about itself in its header: muongate's own commit and the versions around it."""

from __future__ import annotations

import contextlib
import functools
import platform
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


@functools.cache  # the header line and the stream's header both ask: read the machine once
def cpu_line(threads: int | None = None) -> str:
    """The CPU arithmetic ran on, as far as it can pick a kernel: the processor, the instruction
    set torch's own kernels chose (``ATEN_CPU_CAPABILITY``), the BLAS and oneDNN releases, the
    cores, and the threads a rank runs (``threads``: fixed by ``--rank-threads`` or
    ``OMP_NUM_THREADS``; otherwise shared out over the host's ranks, ``harness.ranks.budget``).
    A batched product or a matmul may round differently from one of these to another."""
    import re

    import torch

    from harness.ranks.budget import ThreadBudget, usable_cores

    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        model = found.group(1).strip() if found else model
    threads = ThreadBudget(1, threads=threads).fixed
    config = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=(\w+)", config)
    mkl = re.search(r"Math Kernel Library Version ([\d.]+)", config)
    dnn = re.search(r"MKL-DNN (v[\d.]+)", config)
    parts = [
        model,
        torch.backends.cpu.get_cpu_capability(),
        (blas.group(1) if blas else "BLAS ?") + (f" {mkl.group(1)}" if mkl else ""),
        *([f"oneDNN {dnn.group(1)}"] if dnn else []),
        f"{usable_cores()} cores",
        f"{threads} thread(s) a rank" if threads else "rank threads shared over the host's ranks",
    ]
    return ", ".join(parts)


def make_header(*, backend: str, devices: list[str], nproc: int, **fields: Any) -> Header:
    """The one header of a results stream (gates and ``python -m harness.train`` alike)."""
    import torch

    from harness.ranks.relay import arrangement

    return Header(
        muongate=muongate_version(),
        git_commit=muongate_commit(),
        torch=torch.__version__,
        backend=backend,
        device=devices[0].split(":")[0],
        devices=tuple(devices),
        arrangement=arrangement(backend, devices),
        nproc=nproc,
        cpu=cpu_line(fields.pop("threads", None)),
        time=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **fields,
    )
