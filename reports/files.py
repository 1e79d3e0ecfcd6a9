"""A report directory: ``equivalence.html``, ``equivalence.md`` and ``figures.json``."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import fields
from typing import Any

from reports.html import page
from reports.markdown import to_markdown
from reports.records import Header
from reports.summary import GateSummary, RunSummary


def write_files(summary: RunSummary, directory: str | os.PathLike[str]) -> None:
    """Writes the three files of a report (next to its stream)."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "equivalence.html"), "w", encoding="utf-8") as f:
        f.write(page(summary))
    with open(os.path.join(directory, "equivalence.md"), "w", encoding="utf-8") as f:
        f.write(to_markdown(summary))
    with open(os.path.join(directory, "figures.json"), "w", encoding="utf-8") as f:
        json.dump(figures(summary), f, indent=1, sort_keys=True)


def figures(summary: RunSummary) -> dict[str, Any]:
    """Per-gate figures as plain JSON: what ``--gate-baseline`` and ``compare`` read back."""
    # Not dataclasses.asdict: it rebuilds a Counter from its items, counting the pairs.
    gates = {name: {f.name: _plain(getattr(g, f.name)) for f in fields(g)} for name, g in summary.gates.items()}
    return {"header": summary.header.to_json(), "gates": gates}


def _plain(value: Any) -> Any:
    if isinstance(value, set):
        return sorted(value)
    if isinstance(value, Counter):
        return dict(value)
    return value


def from_figures(data: dict[str, Any]) -> RunSummary:
    """A ``RunSummary`` (per-gate figures only) from a ``figures.json``, this one's or an older one's."""
    known = {f.name for f in fields(GateSummary)}
    gates = {}
    for name, g in data["gates"].items():
        values = {k: v for k, v in g.items() if k in known}
        values.update(
            tiers=set(g.get("tiers", ())),
            histogram=Counter(g.get("histogram", {})),
            statuses=Counter(g.get("statuses", {})),
        )
        gates[name] = GateSummary(**values)
    return RunSummary(Header.from_json(data.get("header", {})), gates)
