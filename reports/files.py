"""A report directory: ``equivalence.html``, ``equivalence.md`` and ``figures.json``.

``figures.json`` is strict JSON, which has no NaN or infinity: a figure that is one is written
as the string ``"nan"``, ``"inf"`` or ``"-inf"``, and ``from_figures`` reads it back as that float
(an older file's bare ``NaN`` and ``Infinity``, which Python's reader takes, read as before).
"""

from __future__ import annotations

import json
import math
import os
import secrets
from collections import Counter
from dataclasses import fields
from pathlib import Path
from typing import Any

from reports.html import page
from reports.markdown import to_markdown
from reports.records import Header
from reports.summary import GateSummary, RunSummary

#: the strings that stand for the floats JSON cannot hold
_NOT_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
#: the figures of a gate that are floats, the only fields whose strings are read back as floats
#: (a gate or a tier may well be named "nan")
_FLOATS = {f.name for f in fields(GateSummary) if str(f.type) in ("float", "float | None")}


def write_files(summary: RunSummary, directory: str | os.PathLike[str]) -> None:
    """Writes the three files of a report (next to its stream).

    All three are rendered before any is written, and each is written beside itself and then
    renamed over it: a renderer that raises, or a process killed mid-write, leaves the files as
    they were, never one empty or cut short (a 0-byte ``equivalence.html`` hid a run's results
    once, issue #50)."""
    texts = {
        "equivalence.html": page(summary),
        "equivalence.md": to_markdown(summary),
        "figures.json": json.dumps(figures(summary), indent=1, sort_keys=True, allow_nan=False),
    }
    os.makedirs(directory, exist_ok=True)
    for name, text in texts.items():
        _replace(os.path.join(directory, name), text)


def _replace(path: str, text: str) -> None:
    """``path`` holds ``text``, or what it held before: never anything in between."""
    # A name of its own per writer (xdist workers may write one directory), opened as a plain
    # file so it takes the umask's permissions, as the file it replaces did (mkstemp's are 0600).
    temporary = os.path.join(
        os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    )
    try:
        # backslashreplace: a lone surrogate (output decoded with surrogateescape) is written as
        # its escape rather than failing the whole file
        with open(temporary, "x", encoding="utf-8", errors="backslashreplace") as f:
            f.write(text)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def figures(summary: RunSummary) -> dict[str, Any]:
    """Per-gate figures as plain, strict JSON: what ``--gate-baseline`` and ``compare`` read back."""
    # Not dataclasses.asdict: it rebuilds a Counter from its items, counting the pairs.
    gates = {name: {f.name: _plain(getattr(g, f.name)) for f in fields(g)} for name, g in summary.gates.items()}
    return _finite({"header": summary.header.to_json(), "gates": gates})


def _plain(value: Any) -> Any:
    if isinstance(value, set):
        return sorted(value)
    if isinstance(value, Counter):
        return dict(value)
    return value


def _finite(value: Any) -> Any:
    """``value`` with every NaN and infinity in it as its string in ``_NOT_FINITE``."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def from_figures(data: dict[str, Any]) -> RunSummary:
    """A ``RunSummary`` (per-gate figures only) from a ``figures.json``, this one's or an older one's."""
    known = {f.name for f in fields(GateSummary)}
    gates = {}
    for name, g in data["gates"].items():
        values = {k: _float(v) if k in _FLOATS else v for k, v in g.items() if k in known}
        values.update(
            tiers=set(g.get("tiers", ())),
            judged=set(g.get("judged", ())),
            histogram=Counter(g.get("histogram", {})),
            statuses=Counter(g.get("statuses", {})),
            layouts=Counter(g.get("layouts", {})),
        )
        gates[name] = GateSummary(**values)
    return RunSummary(Header.from_json(data.get("header", {})), gates)


def _float(value: Any) -> Any:
    return _NOT_FINITE.get(value, value) if isinstance(value, str) else value


#: what a run writes to its report directory, besides its streams (``results*.jsonl``)
REPORT_FILES = ("equivalence.html", "equivalence.md", "figures.json")


def clear_report(directory: str | os.PathLike[str]) -> list[str]:
    """Removes an earlier run's report files and streams from ``directory`` (nothing else in it),
    so that it holds this run's only; returns the names removed."""
    root = Path(directory)
    if not root.is_dir():
        return []
    stale = sorted({p for name in REPORT_FILES if (p := root / name).is_file()} | set(root.glob("results*.jsonl")))
    for path in stale:
        path.unlink(missing_ok=True)
    return [p.name for p in stale]
