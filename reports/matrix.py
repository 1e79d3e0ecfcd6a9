"""The compatibility matrix (``harness.matrix``) as a terminal table, Markdown and HTML: a row
per adapter, a column per gate and per layout family, each cell a verdict and its figure."""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from reports.summary import LAYOUT_ORDER


@dataclass(frozen=True)
class Cell:
    """A verdict: ``bitwise``, ``tier``, ``passes`` (the gate's own verdict, nothing compared:
    an input refused by name), ``fails``, ``crashes``, ``not supported`` or ``not run``."""

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


@dataclass(frozen=True)
class Matrix:
    rows: list[Row]

    def gate_columns(self) -> list[str]:
        return sorted({g for r in self.rows for g in r.gates})

    def layout_columns(self) -> list[str]:
        seen = {f for r in self.rows for f in r.layouts}
        return [f for f in LAYOUT_ORDER if f in seen] + sorted(seen - set(LAYOUT_ORDER))

    def table(self) -> tuple[list[str], list[list[str]]]:
        """Columns and rows of text: package, backend, then gates and ``layout: …`` columns."""
        gates, layouts = self.gate_columns(), self.layout_columns()
        columns = ["package", "adapter", "torch, backend", *gates, *(f"layout: {f}" for f in layouts)]
        rows = []
        for r in self.rows:
            cells = [r.gates.get(g, NOT_RUN).text() for g in gates]
            cells += [r.layouts.get(f, NOT_RUN).text() for f in layouts]
            package = r.package + (f" ({r.note})" if r.note else "")
            ran = f"{r.torch}, {r.backend}" if r.torch else "– (did not run)"
            rows.append([package, r.spec, ran, *cells])
        return columns, rows


def render_markdown(matrix: Matrix) -> str:
    columns, rows = matrix.table()
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def render_html(matrix: Matrix) -> str:
    columns, rows = matrix.table()
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f'<td class="{_status_class(c)}">{html.escape(c)}</td>' for c in row) + "</tr>" for row in rows
    )
    style = (
        "body{font-family:sans-serif}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px;"
        "vertical-align:top;font-size:13px}.bitwise,.passes{background:#e6f4ea}.tier{background:#fef7e0}"
        ".fails,.crashes{background:#fce8e6}.not{color:#777}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>muongate compatibility matrix</title>"
        f"<style>{style}</style></head><body><h1>muongate compatibility matrix</h1>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></body></html>\n"
    )


def _status_class(text: str) -> str:
    first = text.split(" ", 1)[0].rstrip(":")
    return first if first in ("bitwise", "tier", "passes", "fails", "crashes", "not") else ""


def render_terminal(matrix: Matrix) -> None:
    from rich.console import Console
    from rich.table import Table

    columns, rows = matrix.table()
    table = Table(title="muongate compatibility matrix", show_lines=True)
    for c in columns:
        table.add_column(c, overflow="fold")
    for row in rows:
        table.add_row(*row)
    Console(emoji=False, width=max(160, Console().width)).print(table)
