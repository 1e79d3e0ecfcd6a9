"""The summary as Markdown: ``equivalence.md``, and a CI job's step summary."""

from __future__ import annotations

import re
from collections.abc import Sequence

from reports.summary import (
    GATE_COLUMNS,
    GATE_LEGEND,
    SCENARIO_COLUMNS,
    TRAINING_COLUMNS,
    RunSummary,
    encodable,
    gate_row,
    layout_rows,
    scenario_row,
    title,
    training_row,
)


def _cell(text: str) -> str:
    # a line break of any kind ends a table's row
    return re.sub(r"\r\n?|\n", " ", text.replace("|", "\\|"))


def _fence(text: str) -> str:
    """A code fence longer than any run of backticks in ``text``, which would close a shorter one."""
    return "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))


def _table(columns: Sequence[str], rows: Sequence[Sequence[str]], right: set[str]) -> list[str]:
    lines = ["| " + " | ".join(_cell(c) for c in columns) + " |"]
    lines.append("|" + "|".join("---:" if c in right else "---" for c in columns) + "|")
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def to_markdown(summary: RunSummary) -> str:
    lines = ["# muongate equivalence report", "", title(summary.header), ""]
    numeric = set(GATE_COLUMNS) - {"gate", "tiers", "judged"}
    lines += _table(GATE_COLUMNS, [gate_row(g) for g in summary.ordered_gates()], numeric)
    lines += ["", f"_{GATE_LEGEND}_"]
    layouts = layout_rows(summary)
    if layouts:
        lines += ["", "Cases per layout family:", "", *_table(("gate", "layouts"), layouts, set())]
    for f in summary.failures:
        lines += ["", f"**FAILED** `{f.gate}`: {f.finding}", "", f"minimal case: `{f.case}`"]
        if f.narrowed:
            lines += ["", f"narrowed for the candidate: {'; '.join(f.narrowed)}"]
        message = f.message[:2000]
        lines += ["", _fence(message), message, _fence(message)]
        if f.reproduce:
            lines += ["", f"reproduce: `{f.reproduce}`"]
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
    if summary.skips:
        lines += ["", "## Skipped", ""] + [f"- `{s.gate}`: {s.reason}" for s in summary.skips]
    return encodable("\n".join(lines) + "\n")
