"""From plain records to a summary (data) and from the summary to rich tables (rendering).

``summarize`` knows nothing of rich; ``render`` knows nothing of how records were made.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text


@dataclass
class GateSummary:
    """One gate's figures over all its cases."""

    gate: str
    cases: int = 0
    failed_cases: int = 0
    comparisons: int = 0
    bitwise: int = 0
    tolerance_passes: int = 0
    worst_abs_diff: float = 0.0
    worst_ulp: float = 0.0
    seconds: float = 0.0
    tiers: set[str] = field(default_factory=set)


@dataclass
class RunSummary:
    header: dict[str, Any]
    gates: dict[str, GateSummary]
    failures: list[dict[str, Any]]
    negative_controls: list[dict[str, Any]] = field(default_factory=list)


def summarize(records: Iterable[dict[str, Any]]) -> RunSummary:
    header: dict[str, Any] = {}
    gates: dict[str, GateSummary] = {}
    failures: list[dict[str, Any]] = []
    controls: list[dict[str, Any]] = []
    for r in records:
        kind = r.get("kind")
        if kind == "header":
            header = r
            continue
        if kind == "negative_control":
            controls.append(r)
            continue
        g = gates.setdefault(r["gate"], GateSummary(r["gate"]))
        if kind == "case":
            g.cases += 1
            g.seconds += r.get("seconds", 0.0)
            if not r["passed"]:
                g.failed_cases += 1
                failures.append(r)
        elif kind == "comparison":
            g.comparisons += 1
            g.tiers.add(r["tier"])
            if r["bitwise"]:
                g.bitwise += 1
            elif r["passed"]:
                g.tolerance_passes += 1
            g.worst_abs_diff = max(g.worst_abs_diff, r["max_abs_diff"])
            g.worst_ulp = max(g.worst_ulp, r["max_ulp"])
    return RunSummary(header, gates, failures, controls)


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.3g}"


def render(summary: RunSummary) -> Group:
    h = summary.header
    title = (
        f"muongate equivalence: torch {h.get('torch', '?')}, {h.get('backend', '?')} on {h.get('device', '?')}, "
        f"nproc {h.get('nproc', '?')}, hypothesis profile {h.get('hypothesis_profile', '?')}"
    )
    table = Table(title=title, title_justify="left")
    for col in (
        "gate",
        "tiers",
        "cases",
        "failed",
        "comparisons",
        "bitwise",
        "tol. pass",
        "worst max|diff|",
        "worst ULP",
        "seconds",
    ):
        table.add_column(col, justify="left" if col in ("gate", "tiers") else "right")
    for g in sorted(summary.gates.values(), key=lambda g: g.gate):
        style = "red" if g.failed_cases else "green"
        table.add_row(
            Text(g.gate, style=style),
            ",".join(sorted(g.tiers)),
            str(g.cases),
            str(g.failed_cases),
            str(g.comparisons),
            str(g.bitwise),
            str(g.tolerance_passes),
            _fmt(g.worst_abs_diff),
            _fmt(g.worst_ulp),
            f"{g.seconds:.1f}",
        )
    parts: list[Any] = [table]
    if summary.negative_controls:
        controls = Table(title="negative controls (known-wrong variants the gates must catch)", title_justify="left")
        controls.add_column("control")
        controls.add_column("caught")
        controls.add_column("minimal case")
        for c in summary.negative_controls:
            caught = Text("yes", style="green") if c["detected"] else Text("NO", style="bold red")
            controls.add_row(c["gate"].removeprefix("negative:"), caught, c["case"])
        parts.append(controls)
    for f in summary.failures[-20:]:
        parts.append(Text(f"FAILED {f['gate']}: {f.get('case', '')}", style="bold red"))
        parts.append(Text(f.get("message", "")[:2000]))
        if f.get("reproduce"):
            parts.append(Text(f"reproduce: {f['reproduce']}"))
    return Group(*parts)


def to_markdown(summary: RunSummary) -> str:
    lines = ["# muongate equivalence report", ""]
    h = summary.header
    lines.append(
        f"torch {h.get('torch', '?')}, {h.get('backend', '?')} on {h.get('device', '?')}, nproc {h.get('nproc', '?')}, "
        f"hypothesis profile {h.get('hypothesis_profile', '?')}, commit {h.get('git_commit', '?')}"
    )
    lines += [
        "",
        "| gate | tiers | cases | failed | comparisons | bitwise | tol. pass | worst max\\|diff\\| | worst ULP |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for g in sorted(summary.gates.values(), key=lambda g: g.gate):
        lines.append(
            f"| {g.gate} | {','.join(sorted(g.tiers))} | {g.cases} | {g.failed_cases} | {g.comparisons} | {g.bitwise} | {g.tolerance_passes} | "
            f"{_fmt(g.worst_abs_diff)} | {_fmt(g.worst_ulp)} |"
        )
    if summary.negative_controls:
        lines += ["", "## Negative controls", "", "| control | caught | minimal case |", "|---|---|---|"]
        for c in summary.negative_controls:
            lines.append(
                f"| {c['gate'].removeprefix('negative:')} | {'yes' if c['detected'] else '**NO**'} | `{c['case']}` |"
            )
    for f in summary.failures[-20:]:
        lines += ["", f"**FAILED** `{f['gate']}`: `{f.get('case', '')}`", "", "```", f.get("message", "")[:2000], "```"]
        if f.get("reproduce"):
            lines += ["", f"reproduce: `{f['reproduce']}`"]
    return "\n".join(lines) + "\n"


def write_files(summary: RunSummary, directory: str, width: int = 140) -> None:
    """``equivalence.html`` (self-contained) and ``equivalence.md`` beside the stream."""
    import os

    console = Console(record=True, width=width, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(render(summary))
    console.save_html(os.path.join(directory, "equivalence.html"))
    with open(os.path.join(directory, "equivalence.md"), "w", encoding="utf-8") as f:
        f.write(to_markdown(summary))
