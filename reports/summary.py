"""From plain records to a summary (data) and from the summary to rich tables (rendering).

``summarize`` knows nothing of rich; ``render`` knows nothing of how records were made.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
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
    worst_rel_fro: float = 0.0
    sv_min: float | None = None
    sv_max: float | None = None
    worst_orthogonality: float | None = None


@dataclass
class RunSummary:
    """A run: its header, every gate's figures, each failing gate's minimal case, skips."""

    header: dict[str, Any]
    gates: dict[str, GateSummary]
    failures: list[dict[str, Any]]
    negative_controls: list[dict[str, Any]] = field(default_factory=list)
    skips: list[dict[str, Any]] = field(default_factory=list)
    scenarios: list[dict[str, Any]] = field(default_factory=list)
    training: list[dict[str, Any]] = field(default_factory=list)


def summarize(records: Iterable[dict[str, Any]]) -> RunSummary:
    """Folds a stream's records into a summary.

    Hypothesis re-runs a failing test many times while it shrinks, and replays the
    minimal example last, so the last failing case of a gate is the one to show.
    """
    header: dict[str, Any] = {}
    gates: dict[str, GateSummary] = {}
    last_failure: dict[str, dict[str, Any]] = {}
    controls: list[dict[str, Any]] = []
    skips: list[dict[str, Any]] = []
    scenarios: list[dict[str, Any]] = []
    training: list[dict[str, Any]] = []
    for r in records:
        kind = r.get("kind")
        if kind == "header":
            header = r
            continue
        if kind == "negative_control":
            controls.append(r)
            continue
        if kind == "skip":
            skips.append(r)
            continue
        if kind == "scenario":
            scenarios.append(r)
            continue
        if kind == "training":  # a run writes its curve after every chunk: keep the latest
            training = [t for t in training if (t["gate"], t["case"]) != (r["gate"], r["case"])] + [r]
            continue
        if kind not in ("case", "comparison"):
            continue
        g = gates.setdefault(r["gate"], GateSummary(r["gate"]))
        if kind == "case":
            g.cases += 1
            g.seconds += r.get("seconds", 0.0)
            if "tier" in r:
                g.tiers.add(r["tier"])
            if not r["passed"]:
                g.failed_cases += 1
                last_failure[r["gate"]] = r
            if "sv_min" in r:
                g.sv_min = r["sv_min"] if g.sv_min is None else min(g.sv_min, r["sv_min"])
                g.sv_max = r["sv_max"] if g.sv_max is None else max(g.sv_max, r["sv_max"])
            if "orthogonality_error" in r:
                g.worst_orthogonality = max(g.worst_orthogonality or 0.0, r["orthogonality_error"])
        elif kind == "comparison":
            g.comparisons += 1
            g.tiers.add(r["tier"])
            if r["bitwise"]:
                g.bitwise += 1
            elif r["passed"]:
                g.tolerance_passes += 1
            g.worst_abs_diff = max(g.worst_abs_diff, r["max_abs_diff"])
            g.worst_ulp = max(g.worst_ulp, r["max_ulp"])
            g.worst_rel_fro = max(g.worst_rel_fro, r.get("rel_fro", 0.0))
    return RunSummary(header, gates, list(last_failure.values()), controls, skips, scenarios, training)


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.3g}"


_OUTCOME_STYLE = {"completed": "green", "error": "bold red"}
SCENARIO_COLUMNS = ("gate", "scenario", "outcome", "seconds", "what showed it")


def scenario_row(r: dict[str, Any]) -> tuple[str, str, str, str, str]:
    """A scenario record as the report's columns (MoE deadlock reproductions, diagnoses, alternatives)."""
    env = " ".join(f"{k}={v}" for k, v in r.get("env", {}).items())
    name = f"{r['scenario']} [{r['wrapping']} units, {r['variant']} model{', ' + env if env else ''}]"
    return r["gate"], name, r["outcome"], f"{r.get('seconds', 0.0):.1f}", r.get("detail", "")


TRAINING_COLUMNS = ("gate", "case", "steps", "train bits/byte", "held-out bits/byte")


def training_row(r: dict[str, Any]) -> tuple[str, str, str, str, str]:
    """A training record as the report's columns: first → last of each curve."""
    train = r.get("train_bits") or []
    held = [v for v in r.get("held_out_bits") or [] if v is not None]
    fmt = lambda vs: f"{vs[0]:.3f} → {vs[-1]:.3f}" if vs else "–"  # noqa: E731
    return r["gate"], r["case"], str(len(train)), fmt(train), fmt(held)


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
        "worst rel. Frob.",
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
            _fmt(g.worst_rel_fro),
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
    if summary.scenarios:
        table = Table(title="MoE empty-expert scenarios (what each run did)", title_justify="left")
        for col in SCENARIO_COLUMNS:
            table.add_column(col, justify="right" if col == "seconds" else "left")
        for r in summary.scenarios:
            gate, name, outcome, seconds, detail = scenario_row(r)
            table.add_row(gate, name, Text(outcome, style=_OUTCOME_STYLE.get(outcome, "yellow")), seconds, detail[:400])
        parts.append(table)
    if summary.training:
        table = Table(title="training (FSDP2 + sharded Muon), bits per byte: first → last step", title_justify="left")
        for col in TRAINING_COLUMNS:
            table.add_column(col, justify="left" if col in ("gate", "case") else "right")
        for r in summary.training:
            table.add_row(*training_row(r))
        parts.append(table)
    for f in summary.failures:
        tried = summary.gates[f["gate"]].failed_cases
        parts.append(
            Text(
                f"FAILED {f['gate']} ({tried} failing case(s) while shrinking); minimal: {f.get('case', '')}",
                style="bold red",
            )
        )
        parts.append(Text(f.get("message", "")[:2000]))
        if f.get("reproduce"):
            parts.append(Text(f"reproduce: {f['reproduce']}"))
    for skip in summary.skips:
        parts.append(Text(f"SKIPPED {skip['gate']}: {skip.get('reason', '')}", style="yellow"))
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
        "| gate | tiers | cases | failed | comparisons | bitwise | tol. pass | worst max\\|diff\\| | worst ULP | worst rel. Frob. |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for g in sorted(summary.gates.values(), key=lambda g: g.gate):
        lines.append(
            f"| {g.gate} | {','.join(sorted(g.tiers))} | {g.cases} | {g.failed_cases} | {g.comparisons} | {g.bitwise} | {g.tolerance_passes} | "
            f"{_fmt(g.worst_abs_diff)} | {_fmt(g.worst_ulp)} | {_fmt(g.worst_rel_fro)} |"
        )
    if summary.negative_controls:
        lines += ["", "## Negative controls", "", "| control | caught | minimal case |", "|---|---|---|"]
        for c in summary.negative_controls:
            lines.append(
                f"| {c['gate'].removeprefix('negative:')} | {'yes' if c['detected'] else '**NO**'} | `{c['case']}` |"
            )
    if summary.scenarios:
        lines += [
            "",
            "## MoE empty-expert scenarios",
            "",
            "| " + " | ".join(SCENARIO_COLUMNS) + " |",
            "|---|---|---|---:|---|",
        ]
        for r in summary.scenarios:
            cells = [c.replace("|", "\\|").replace("\n", " ") for c in scenario_row(r)]
            lines.append("| " + " | ".join(cells) + " |")
    if summary.training:
        lines += ["", "## Training", "", "| " + " | ".join(TRAINING_COLUMNS) + " |", "|---|---|---:|---:|---:|"]
        lines += ["| " + " | ".join(training_row(r)) + " |" for r in summary.training]
    for f in summary.failures:
        lines += ["", f"**FAILED** `{f['gate']}`: `{f.get('case', '')}`", "", "```", f.get("message", "")[:2000], "```"]
        if f.get("reproduce"):
            lines += ["", f"reproduce: `{f['reproduce']}`"]
    if summary.skips:
        lines += ["", "## Skipped", ""] + [f"- `{s['gate']}`: {s.get('reason', '')}" for s in summary.skips]
    return "\n".join(lines) + "\n"


def write_files(summary: RunSummary, directory: str, records: Sequence[dict[str, Any]] = (), width: int = 140) -> None:
    """``equivalence.html`` (self-contained, with pictures) and ``equivalence.md`` in ``directory``."""
    import os

    from reports.html import page

    console = Console(record=True, width=width, file=io.StringIO())
    console.print(render(summary))
    tables = console.export_html(inline_styles=True, code_format='<pre style="font-family:monospace">{code}</pre>')
    with open(os.path.join(directory, "equivalence.html"), "w", encoding="utf-8") as f:
        f.write(page(summary, tables, list(records)))
    with open(os.path.join(directory, "equivalence.md"), "w", encoding="utf-8") as f:
        f.write(to_markdown(summary))
    with open(os.path.join(directory, "figures.json"), "w", encoding="utf-8") as f:
        json.dump(figures(summary), f, indent=1, sort_keys=True)


def figures(summary: RunSummary) -> dict[str, Any]:
    """Per-gate figures as plain JSON: what ``--gate-baseline`` and ``compare`` read back."""
    gates = {name: {**asdict(g), "tiers": sorted(g.tiers)} for name, g in summary.gates.items()}
    return {"header": summary.header, "gates": gates}


def from_figures(data: dict[str, Any]) -> RunSummary:
    """A ``RunSummary`` (per-gate figures only) from a ``figures.json``."""
    gates = {name: GateSummary(**{**g, "tiers": set(g["tiers"])}) for name, g in data["gates"].items()}
    return RunSummary(data.get("header", {}), gates, [])
