"""The summary as Markdown: ``equivalence.md``, and a CI job's step summary."""

from __future__ import annotations

import re
from collections.abc import Sequence

from reports.summary import (
    GATE_COLUMNS,
    GATE_LEGEND,
    ROUTING_COLUMNS,
    SCENARIO_COLUMNS,
    TRAINING_COLUMNS,
    RunSummary,
    encodable,
    failure_word,
    gate_row,
    layout_rows,
    names_candidate,
    outcome_line,
    routing_caption,
    scenario_row,
    skip_groups,
    test_names,
    title,
    training_row,
    unjudged_lines,
    unjudged_reason,
)


def _cell(text: str) -> str:
    # a line break of any kind ends a table's row
    return re.sub(r"\r\n?|\n", " ", text.replace("|", "\\|"))


def _fence(text: str) -> str:
    """A code fence longer than any run of backticks in ``text``, which would close a shorter one."""
    return "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))


def _code(text: str) -> str:
    """``text`` as inline code, its delimiters longer than any run of backticks in it."""
    ticks = "`" * (1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    return f"{ticks} {text} {ticks}" if text.startswith("`") or text.endswith("`") else f"{ticks}{text}{ticks}"


def _table(columns: Sequence[str], rows: Sequence[Sequence[str]], right: set[str]) -> list[str]:
    lines = ["| " + " | ".join(_cell(c) for c in columns) + " |"]
    lines.append("|" + "|".join("---:" if c in right else "---" for c in columns) + "|")
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def to_markdown(summary: RunSummary) -> str:
    """The header line, every gate by outcome (and, where a named candidate had nothing judged, why),
    the gate table with each failure's minimal case right under it, then the other tables and
    the skips, one line per reason."""
    lines = ["# muongate equivalence report", "", title(summary.header), ""]
    if summary.header.cpu:
        lines += [f"CPU: {_cell(summary.header.cpu)}", ""]
    lines += [f"**{outcome_line(summary)}**"]
    why = unjudged_reason(summary) if names_candidate(summary.header) else ""
    if why:
        lines += ["", f"> **NOT JUDGED:** {_cell(why)}"]
    numeric = set(GATE_COLUMNS) - {"gate", "tiers", "judged"}
    if summary.gates:
        lines += ["", *_table(GATE_COLUMNS, [gate_row(g) for g in summary.ordered_gates()], numeric)]
    for f in summary.failures:
        tried = summary.gates[f.gate].failed_cases if f.gate in summary.gates else 0
        lines += [
            "",
            f"**{_cell(failure_word(summary, f.gate))}** `{f.gate}`: {f.finding} ({tried} failing case(s) while shrinking)",
        ]
        lines += ["", f"minimal case: `{f.case}`"]
        if f.narrowed:
            lines += ["", f"narrowed for the candidate: {'; '.join(f.narrowed)}"]
        message = f.message[:2000]
        lines += ["", _fence(message), message, _fence(message)]
        if f.reproduce:
            lines += ["", f"reproduce: `{f.reproduce}`"]
    lines += ["", f"_{GATE_LEGEND}_"]
    if summary.header.replayed:
        lines += ["", "Layout replayed (`--layout-from`), what was kept:", ""]
        lines += [f"- {_cell(line)}" for line in summary.header.replayed]
    layouts = layout_rows(summary)
    if layouts:
        lines += ["", "Cases per layout family:", "", *_table(("gate", "layouts"), layouts, set())]
    if summary.negative_controls:
        rows = [
            (c.gate.removeprefix("negative:"), "yes" if c.detected else "**NO**", f"`{c.case}`")
            for c in summary.negative_controls
        ]
        lines += ["", "## Negative controls", "", *_table(("control", "caught", "minimal case"), rows, set())]
    if summary.scenarios:
        lines += ["", "## MoE empty-expert scenarios", ""]
        lines += _table(SCENARIO_COLUMNS, [scenario_row(r) for r in summary.scenarios], {"seconds"})
    if summary.training:
        lines += ["", "## Training", ""]
        lines += _table(
            TRAINING_COLUMNS, [training_row(r) for r in summary.training], set(TRAINING_COLUMNS) - {"gate", "case"}
        )
    for routing in summary.routings:
        lines += ["", "## Routing", "", _cell(routing_caption(routing)), ""]
        lines += _table(ROUTING_COLUMNS, [tuple(row) for row in routing.rows], set())
    if summary.unjudged:
        lines += ["", "## Not judged", "", *(_cell(f"- {line}") for line in unjudged_lines(summary.unjudged))]
    if summary.skips:
        lines += ["", f"## Skipped: {len(summary.skips)} gate test(s)", ""]
        for text, skips in skip_groups(summary):
            names = ", ".join(_code(name) + (f" ×{n}" if n > 1 else "") for name, n in test_names(skips))
            lines.append(_cell(f"- {len(skips)} gate test(s): {text} ({names})"))
    return encodable("\n".join(lines) + "\n")
