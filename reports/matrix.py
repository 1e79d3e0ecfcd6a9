"""The compatibility matrix (``harness.matrix``) as a terminal table, Markdown and HTML: a row
per adapter, a column per gate and per layout family, each cell a verdict and its figure; one
table per kind of candidate (optimizers through ``--impl``, kernels through ``--kernel``),
since the two meet different gates."""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from reports.summary import LAYOUT_ORDER


@dataclass(frozen=True)
class Cell:
    """A verdict: ``bitwise``, ``tier``, ``passes`` (the gate's own verdict, nothing compared:
    an input refused by name), ``fails``, ``crashes``, ``not supported``, ``not run``, or ``not
    declared`` (its detail: what the package did there when tried anyway, ``tried: …``)."""

    status: str
    detail: str = ""
    cases: int = 0
    #: of ``cases``, how many were narrowed to fit the candidate's declarations
    narrowed: int = 0

    def text(self) -> str:
        counts = f"{self.cases}, {self.narrowed} narrowed" if self.narrowed else f"{self.cases}"
        shown = f"{self.status} ({counts})" if self.cases else self.status
        return f"{shown}: {self.detail}" if self.detail else shown


NOT_RUN = Cell("not run")


@dataclass(frozen=True)
class Row:
    spec: str
    package: str
    torch: str
    backend: str
    gates: dict[str, Cell] = field(default_factory=dict)
    layouts: dict[str, Cell] = field(default_factory=dict)
    note: str = ""
    #: which candidate it is: an ``optimizer`` (``--impl``) or a ``kernel`` (``--kernel``)
    kind: str = "optimizer"
    #: what its cells judged it against: ``reference`` (reference.Muon) or ``self`` (``--against self``)
    against: str = "reference"


#: the kinds of row, in the order their tables come, with each table's title
KINDS = {"optimizer": "Optimizers (`--impl`)", "kernel": "Newton–Schulz kernels (`--kernel`)"}


@dataclass(frozen=True)
class Matrix:
    rows: list[Row]

    def kinds(self) -> list[str]:
        """The kinds of row it has, in ``KINDS`` order."""
        return [k for k in KINDS if any(r.kind == k for r in self.rows)]

    def table(self, kind: str = "optimizer") -> tuple[list[str], list[list[str]]]:
        """Columns and rows of text for one kind of row: package, backend, then the gates and
        ``layout: …`` columns those rows have."""
        mine = [r for r in self.rows if r.kind == kind]
        gates = sorted({g for r in mine for g in r.gates})
        seen = {f for r in mine for f in r.layouts}
        layouts = [f for f in LAYOUT_ORDER if f in seen] + sorted(seen - set(LAYOUT_ORDER))
        columns = ["package", "adapter", "torch, backend", *gates, *(f"layout: {f}" for f in layouts)]
        rows = []
        for r in mine:
            cells = [r.gates.get(g, NOT_RUN).text() for g in gates]
            cells += [r.layouts.get(f, NOT_RUN).text() for f in layouts]
            package = r.package + (f" ({r.note})" if r.note else "")
            ran = f"{r.torch}, {r.backend}" if r.torch else "– (did not run)"
            ran += ", against itself on one device" if r.torch and r.against == "self" else ""
            rows.append([package, r.spec, ran, *cells])
        return columns, rows


def render_markdown(matrix: Matrix) -> str:
    """The tables, each under its title when there is more than one kind."""
    parts = []
    for kind in matrix.kinds():
        columns, rows = matrix.table(kind)
        lines = [f"**{KINDS[kind]}**", ""] if len(matrix.kinds()) > 1 else []
        lines += ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        lines += ["| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in row) + " |" for row in rows]
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


#: a verdict's colour in the HTML grid, and what it means (the legend)
COLOURS = {
    "bitwise": ("#2e7d32", "bitwise: every comparison had the same bits"),
    "passes": ("#66bb6a", "passes: the gate's own verdict, nothing compared (an input refused by name)"),
    "tier": ("#f9a825", "tier: within a named tolerance tier"),
    "fails": ("#c62828", "fails: a comparison differed"),
    "crashes": ("#6a1b9a", "crashes: hang, abort, collective mismatch or error"),
    "not": ("#bdbdbd", "not supported or not run"),
    "probed": ("#ffffff", "dashed border: not declared by the adapter, tried anyway"),
}


def render_html(matrix: Matrix) -> str:
    """One page (no scripts): a grid per kind of row, each cell its verdict's colour and first
    words; the whole verdict on hover (``title``) and on click (``details``)."""
    tables = "".join(_html_table(KINDS[kind], *matrix.table(kind)) for kind in matrix.kinds())
    style = (
        "body{font-family:system-ui,sans-serif;margin:1.5em}table{border-collapse:collapse}"
        "td,th{border:1px solid #fff;padding:3px 5px;vertical-align:top;font-size:12px}"
        "th{background:#eee;writing-mode:vertical-rl;transform:rotate(180deg);white-space:nowrap;max-height:14em}"
        "th.row,td.row{writing-mode:horizontal-tb;transform:none;text-align:left;background:#f7f7f7;max-width:22em}"
        "td.cell{color:#fff;min-width:5.5em}td.cell.not{color:#333}td.cell.probed{outline:2px dashed #000;outline-offset:-3px}"
        ".legend span.probed{color:#000;outline:2px dashed #000}details summary{cursor:pointer;list-style:none}"
        "details[open]{max-width:40em}details div{white-space:pre-wrap;font-size:11px;margin-top:3px}"
        ".legend span{display:inline-block;padding:2px 8px;margin:2px;color:#fff;font-size:12px}"
        + "".join(f".{name}{{background:{colour}}}" for name, (colour, _) in COLOURS.items())
    )
    legend = "".join(f'<span class="{name}">{html.escape(text)}</span>' for name, (_, text) in COLOURS.items())
    return (
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>muongate compatibility matrix</title>"
        f"<style>{style}</style></head><body><h1>muongate compatibility matrix</h1>"
        f"<p class='legend'>{legend}</p>{tables}</body></html>\n"
    )


def _html_table(title: str, columns: list[str], rows: list[list[str]]) -> str:
    """The first three columns (package, adapter, torch) as row headers; every other a coloured cell."""
    head = "".join(
        f'<th{" class=row" if i < 3 else ""} scope="col">{html.escape(c)}</th>' for i, c in enumerate(columns)
    )
    body = []
    for row in rows:
        cells = [f'<td class="row">{html.escape(c)}</td>' for c in row[:3]]
        for column, text in zip(columns[3:], row[3:], strict=True):
            status = _status_class(text)
            short = text.split(":", 1)[0]
            whole = html.escape(f"{column}: {text}")
            cells.append(
                f'<td class="cell {status}" title="{whole}"><details><summary>{html.escape(short)}</summary>'
                f"<div>{html.escape(text)}</div></details></td>"
            )
        body.append("<tr>" + "".join(cells) + "</tr>")
    caption = html.escape(title.replace("`", ""))
    return f"<h2>{caption}</h2><table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _status_class(text: str) -> str:
    """A cell's classes: its verdict's; a cell not declared but tried has the tried verdict's, dashed."""
    tried = text.removeprefix("not declared: tried: ")
    first = tried.split(" ", 1)[0].rstrip(":")
    return (first if first in COLOURS else "") + (" probed" if tried != text else "")


def render_terminal(matrix: Matrix) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(emoji=False, width=max(160, Console().width))
    for kind in matrix.kinds():
        columns, rows = matrix.table(kind)
        table = Table(title=f"muongate compatibility matrix: {KINDS[kind].replace('`', '')}", show_lines=True)
        for c in columns:
            table.add_column(c, overflow="fold")
        for row in rows:
            table.add_row(*row)
        console.print(table)
