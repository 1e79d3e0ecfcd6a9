"""The summary as rich renderables, for the terminal (and a golden test on a plain console).

Every string from a record goes in as ``Text``, never as a ``str``, which rich reads as console
markup: a gate named ``[/]`` raised ``MarkupError``, and ``:smile:`` became an emoji.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from reports.summary import (
    GATE_COLUMNS,
    GATE_LEGEND,
    SCENARIO_COLUMNS,
    TRAINING_COLUMNS,
    RunSummary,
    encodable,
    gate_outcome,
    gate_row,
    layout_rows,
    scenario_row,
    skip_reason,
    title,
    training_row,
)

_OUTCOME_STYLE = {"completed": "green", "error": "bold red"}


def _text(text: str, style: str = "", **kwargs: Any) -> Text:
    """A record's string as it is (no markup), and writable to a UTF-8 terminal."""
    return Text(encodable(text), style=style, **kwargs)


def _table(heading: str, columns: tuple[str, ...], left: set[str], *, wide: str | None = None, width: int = 0) -> Table:
    table = Table(title=heading, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for col in columns:
        if col == wide:  # names are shown whole: a cut name points at nothing
            table.add_column(col, no_wrap=True, min_width=width)
        elif col in left:  # words: folded onto more lines before any figure is cut
            table.add_column(col, overflow="fold", min_width=min(9, len(col) + 2))
        else:
            table.add_column(col, justify="right", no_wrap=True, min_width=len(col))
    return table


def render(summary: RunSummary) -> Group:
    gates = summary.ordered_gates()
    longest = max((len(g.gate) for g in gates), default=4)
    table = _table("", GATE_COLUMNS, {"tiers", "judged"}, wide="gate", width=longest)
    table.title = _text(title(summary.header), "table.title")
    table.caption, table.caption_justify = GATE_LEGEND, "left"
    for g in gates:
        cells = gate_row(g)
        colour = "red" if g.failed_cases else "yellow" if gate_outcome(g) == "not judged" else "green"
        table.add_row(_text(cells[0], colour), *map(_text, cells[1:]))
    parts: list[Any] = [table]
    # The first failure right under the table that counts it, before the detail tables.
    for f in summary.failures:
        tried = summary.gates[f.gate].failed_cases
        parts.append(_text(f"FAILED {f.gate}: {f.finding} ({tried} failing case(s) while shrinking)", "bold red"))
        parts.append(_text(f"minimal case: {f.case}"))
        if f.narrowed:
            parts.append(_text(f"narrowed for the candidate: {'; '.join(f.narrowed)}"))
        parts.append(_text(f.message[:2000]))
        if f.reproduce:
            # One line, however long: it is there to be copied.
            parts.append(_text(f"reproduce: {f.reproduce}", no_wrap=True, overflow="ignore"))
    layouts = layout_rows(summary)
    if layouts:
        families = _table("cases per layout family", ("gate", "layouts"), {"gate", "layouts"})
        for row in layouts:
            families.add_row(*map(_text, row))
        parts.append(families)
    if summary.negative_controls:
        controls = Table(
            title="negative controls (known-wrong variants the gates must catch)",
            title_justify="left",
            box=box.SIMPLE_HEAD,
        )
        controls.add_column("control", no_wrap=True)
        controls.add_column("caught")
        controls.add_column("minimal case", overflow="fold")
        for c in summary.negative_controls:
            caught = Text("yes", style="green") if c.detected else Text("NO", style="bold red")
            controls.add_row(_text(c.gate.removeprefix("negative:")), caught, _text(c.case))
        parts.append(controls)
    if summary.scenarios:
        table = _table(
            "MoE empty-expert scenarios (what each run did)", SCENARIO_COLUMNS, set(SCENARIO_COLUMNS) - {"seconds"}
        )
        for r in summary.scenarios:
            gate, name, outcome, seconds, detail = scenario_row(r)
            outcome_cell = _text(outcome, _OUTCOME_STYLE.get(outcome, "yellow"))
            table.add_row(_text(gate), _text(name), outcome_cell, _text(seconds), _text(detail[:400]))
        parts.append(table)
    if summary.training:
        # The family the run judged (the header's reference class), not always Muon: AdamW candidates train too.
        family = summary.header.reference.rpartition(":")[2]
        trained = f"sharded {family}" if family and family != "none" else "the sharded candidate"
        table = _table(
            f"training (FSDP2 + {trained}), bits per byte: first → last step", TRAINING_COLUMNS, {"gate", "case"}
        )
        for t in summary.training:
            table.add_row(*map(_text, training_row(t)))
        parts.append(table)
    for reason, n in Counter(skip_reason(s) for s in summary.skips).most_common():
        parts.append(_text(f"SKIPPED {n} gate test(s): {reason}", "yellow"))
    return Group(*parts)
