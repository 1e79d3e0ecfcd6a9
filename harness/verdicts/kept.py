"""Measurements kept between sessions, where a session would otherwise measure them afresh.

The cause tiers (``harness.verdicts.causes``) are measured on the gate's device, on random matrices
from a fixed seed: the same inputs, the same code and the same torch on the same machine give
the same figures. Every session that judges a candidate with declared differences measured
them again (about 2 s a setting on the 2-core CI machine, 32 settings: most of a minute per
session, several sessions in a CI run). ``kept`` stores what a function measured in one file
per call, under a key of its name, its arguments, torch's version, the device it ran on (the
CPU's architecture, a GPU's name) and the source of every module that decides the figures.
Change any of those and the key changes: an old figure is never served for new code.

The directory is ``$MUONGATE_CACHE_DIR``, else ``$XDG_CACHE_HOME/muongate``, else
``~/.cache/muongate``; ``MUONGATE_CACHE_DIR=`` (empty) measures every time. A directory that
cannot be written is measured around, never an error: the cache only saves time.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def directory() -> Path | None:
    """Where kept measurements live, or ``None`` where keeping is switched off."""
    chosen = os.environ.get("MUONGATE_CACHE_DIR")
    if chosen is not None:
        return Path(chosen) if chosen else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "muongate"


def _plain(value: Any) -> Any:
    """``value`` in a form whose ``repr`` is the same in every process (a frozenset's order is not)."""
    if isinstance(value, (frozenset, set)):
        return sorted(_plain(v) for v in value)
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def _device(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return f"{device}:{torch.cuda.get_device_name(torch.device(device))}"
    return f"{device}:{platform.machine()}:{platform.processor()}"


def kept(*modules: ModuleType) -> Callable[[F], F]:
    """Keeps what the decorated function returns (JSON: numbers, strings, lists, dicts with
    string keys) between sessions and within one; its last argument names the device. The
    sources of ``modules`` and the function's own module are part of the key."""

    def wrap(fn: F) -> F:
        import torch

        sources = hashlib.sha256()
        for module in (sys.modules[fn.__module__], *modules):
            sources.update(Path(module.__file__ or "").read_bytes())

        @functools.cache
        def measured(*args: Any) -> Any:
            where = directory()
            key = json.dumps(
                [fn.__qualname__, repr(_plain(args)), torch.__version__, _device(args[-1]), sources.hexdigest()]
            )
            path = where / f"{fn.__name__}-{hashlib.sha256(key.encode()).hexdigest()[:32]}.json" if where else None
            if path is not None:
                try:
                    return json.loads(path.read_text())
                except (OSError, ValueError):
                    pass
            value = json.loads(json.dumps(fn(*args)))  # the same types as a kept one
            if path is not None:
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
                        json.dump(value, f)
                    os.replace(f.name, path)  # whole or not at all, for sessions reading at once
                except OSError:
                    pass
            return value

        return functools.wraps(fn)(measured)  # type: ignore[return-value]

    return wrap
