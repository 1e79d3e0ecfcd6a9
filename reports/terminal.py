"""The summary as rich renderables, for the terminal (and a golden test on a plain console).

Every string from a record goes in as ``Text``, never as a ``str``, which rich reads as console
markup: a gate named ``[/]`` raised ``MarkupError``, and ``:smile:`` became an emoji.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from reports.summary import (
    GATE_COLUMNS,
    GATE_LEGEND,
    ROUTING_COLUMNS,
    ROUTING_TITLE,
    SCENARIO_COLUMNS,
    TRAINING_COLUMNS,
    RunSummary,
    encodable,
    failure_word,
    gate_outcome,
    gate_row,
    layout_rows,
    outcome_line,
    routing_caption,
    routing_tally,
    scenario_row,
    skip_reason,
    title,
    training_row,
    unjudged_lines,
)

_OUTCOME_STYLE = {"completed": "green", "error": "bold red"}


def _text(text: str, style: str = "", **kwargs: Any) -> Text:
    """A record's string as it is (no markup), and writable to a UTF-8 terminal."""
    return Text(encodable(text), style=style, **kwargs)


def _table(
    heading: str, columns: tuple[str, ...], left: set[str], *, wide: str | None = None, wrap: tuple[str, ...] = ()
) -> Table:
    """Names (``wide``) whole on one line, words (``left``) wrapped, figures whole and right-justified
    (``wrap``: figures with words in them, which wrap at their spaces)."""
    table = Table(title=heading, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for col in columns:
        if col == wide:  # names are shown whole: a cut name points at nothing
            table.add_column(col, no_wrap=True)
        elif col in left:
            table.add_column(col, overflow="fold")
        else:
            table.add_column(col, justify="right", no_wrap=col not in wrap, overflow="fold")
    return table


#: the width a wrapped column wants before a table counts as fitting, where its lines are longer
_EASY = 16


def _words(console: Console, options: ConsoleOptions, column: Any) -> tuple[int, int]:
    """A column's narrowest width that keeps every word of it whole (every line, where it does not
    wrap), and its widest line."""
    cells = [column.header, *column.cells]
    widths = [Measurement.get(console, options, c if isinstance(c, Text) else Text(str(c))) for c in cells]
    widest = max(w.maximum for w in widths)
    return (widest if column.no_wrap else max(w.minimum for w in widths)), widest


class _Fitted:
    """The first of ``tables`` that fits the width with room to read (each wrapped column
    ``_EASY`` wide or its widest line), else the last with every word whole, else the last as rich
    lays it out. Rich narrows the widest columns first, whatever words they hold, and folds a
    word it cut: a gate name or a figure split over two lines reads as two."""

    def __init__(self, *tables: Table) -> None:
        self.tables = tables

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for table in self.tables:
            if _fit(console, options, table, easy=table is not self.tables[-1]):
                yield table
                return
        yield self.tables[-1]


def _fit(console: Console, options: ConsoleOptions, table: Table, *, easy: bool) -> bool:
    """Sets the widths of ``table``'s columns so that no word of it is cut (``easy``: and each
    wrapped column ``_EASY`` wide or its widest line), where the width allows; the room left is
    shared out evenly, a column taking no more than its widest line."""
    for column in table.columns:
        column.width = 1
    # what the table adds to its columns (padding, edges): its width at one column each, less them
    frame = Measurement.get(console, options.update_width(10_000), table).maximum - len(table.columns)
    room = options.max_width - frame
    ranges = [_words(console, options, column) for column in table.columns]
    if easy:
        ranges = [(max(lo, min(hi, _EASY)), hi) for lo, hi in ranges]
    widths = [lo for lo, _ in ranges]
    spare = room - sum(widths)
    if spare < 0:
        for column in table.columns:
            column.width = None
        return False
    wanting = [i for i, (_, hi) in enumerate(ranges) if widths[i] < hi]
    while spare > 0 and wanting:
        share = max(1, spare // len(wanting))
        for i in sorted(wanting, key=lambda i: ranges[i][1] - widths[i]):
            more = min(share, ranges[i][1] - widths[i], spare)
            widths[i] += more
            spare -= more
        wanting = [i for i in wanting if widths[i] < ranges[i][1]]
    for column, width in zip(table.columns, widths, strict=True):
        column.width = width
    return True


#: the gate table's figures that hold words (``1 (1 narrowed)``, ``2 failed, 1 hang``): wrapped at their spaces
_WORDY = ("cases", "failed", "equal to", "bitwise")


def _gate_tables(summary: RunSummary) -> _Fitted:
    """The gate table, a column each; where that does not fit, what each gate judged, its tiers and
    its cases within causes or not judged under its name, which fits 100 columns."""
    gates = summary.ordered_gates()
    full = _table("", GATE_COLUMNS, {"tiers", "judged"}, wide="gate", wrap=_WORDY)
    narrow = _table("", ("gate", *GATE_COLUMNS[3:]), {"gate"}, wrap=_WORDY)
    for table in (full, narrow):
        table.title = _text(title(summary.header), "table.title")
        table.caption, table.caption_justify = GATE_LEGEND, "left"
    for g in gates:
        cells = gate_row(g)
        colour = "red" if g.failed_cases else "yellow" if gate_outcome(g) == "not judged" else "green"
        full.add_row(_text(cells[0], colour), *map(_text, cells[1:]))
        # "equal to" keeps its counts; what is said of the rest (within causes, not judged) goes under the name
        equal, *said = cells[5].split(" · ")
        name = _text(cells[0], colour) + _text("\n" + " · ".join([cells[1], cells[2], *said]), "dim")
        narrow.add_row(name, *map(_text, (*cells[3:5], equal, *cells[6:])))
    return _Fitted(full, narrow)


def render(summary: RunSummary) -> Group:
    parts: list[Any] = [_gate_tables(summary), _text(outcome_line(summary), "bold")]
    # The first failure right under the table that counts it, before the detail tables.
    for f in summary.failures:
        tried = summary.gates[f.gate].failed_cases
        word = failure_word(summary, f.gate)
        style = "bold red" if word == "FAILED" else "bold yellow"
        parts.append(_text(f"{word} {f.gate}: {f.finding} ({tried} failing case(s) while shrinking)", style))
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
        parts.append(_Fitted(families))
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
        parts.append(_Fitted(controls))
    if summary.scenarios:
        table = _table(
            "MoE empty-expert scenarios (what each run did)", SCENARIO_COLUMNS, set(SCENARIO_COLUMNS) - {"seconds"}
        )
        for r in summary.scenarios:
            gate, name, outcome, seconds, detail = scenario_row(r)
            outcome_cell = _text(outcome, _OUTCOME_STYLE.get(outcome, "yellow"))
            table.add_row(_text(gate), _text(name), outcome_cell, _text(seconds), _text(detail[:400]))
        parts.append(_Fitted(table))
    if summary.training:
        # The family the run judged (the header's reference class), not always Muon: AdamW candidates train too.
        family = summary.header.reference.rpartition(":")[2]
        trained = f"sharded {family}" if family and family != "none" else "the sharded candidate"
        table = _table(
            f"training (FSDP2 + {trained}), bits per byte: first → last step", TRAINING_COLUMNS, {"gate", "case"}
        )
        for t in summary.training:
            table.add_row(*map(_text, training_row(t)))
        parts.append(_Fitted(table))
    for routing in summary.routings:
        off = [row for row in routing.rows if row[3] != "ok"]
        if not off:  # all as declared: one line here, every parameter in the HTML and Markdown reports
            parts.append(_text(f"routing audit · {routing_caption(routing)}: {routing_tally(routing)}", "green"))
            continue
        table = _table(f"routing: {ROUTING_TITLE} (those not as declared)", ROUTING_COLUMNS, set(ROUTING_COLUMNS))
        table.caption = _text(f"{routing_caption(routing)}; {routing_tally(routing)}")
        for name, declared, stepped, verdict in off:
            style = "bold red" if verdict == "wrong" else "yellow"
            table.add_row(_text(name), _text(declared), _text(stepped), _text(verdict, style))
        parts.append(_Fitted(table))
    for reason, n in Counter(skip_reason(s) for s in summary.skips).most_common():
        parts.append(_text(f"SKIPPED {n} gate test(s): {reason}", "yellow"))
    for asked, style in ((True, "bold red"), (False, "yellow")):  # a named part fails the session
        for line in unjudged_lines(u for u in summary.unjudged if u.asked is asked):
            parts.append(_text(f"NOT JUDGED: {line}", style))
    return Group(*parts)
