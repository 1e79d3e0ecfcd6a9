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


#: a verdict's colour in the HTML grid, its text's, and what it means (the legend): greens for a
#: pass (darkest bitwise), yellow for neither pass nor failure, red and purple for failures, grey
#: for what did not run
COLOURS = {
    "bitwise": ("#2e7d32", "#fff", "bitwise: every comparison had the same bits"),
    "passes": ("#66bb6a", "#fff", "passes: the gate's own verdict, nothing compared (an input refused by name)"),
    "tier": ("#aed581", "#1b1b1b", "tier: within a named tolerance tier"),
    "within": ("#dcedc8", "#1b5e20", "within causes: differs only as the adapter's declared causes explain"),
    "judged": ("#fdd835", "#1b1b1b", "not judged: differs where no tier can judge it"),
    "fails": ("#c62828", "#fff", "fails: a comparison differed"),
    "crashes": ("#6a1b9a", "#fff", "crashes: hang, abort, collective mismatch or error"),
    "not": ("#e0e0e0", "#333", "not supported (the adapter declares it does not) or not run"),
    "probed": ("#fff", "#000", "dashed border: not declared by the adapter, tried anyway"),
}
#: cells whose whole verdict their first words say: no line of prose beneath the grid
_PLAIN = ("bitwise", "passes", "not run")


def render_html(matrix: Matrix) -> str:
    """One page (no scripts): a grid per kind of row, a row per adapter and a column per gate and
    layout family, each cell its verdict's colour and first words; beneath it, the prose: what each
    cell that is not plainly bitwise says, a cell's identical verdicts in a row said once. A cell
    links to its line, and shows its whole verdict on hover (``title``)."""
    tables = "".join(_html_table(k, KINDS[kind], *matrix.table(kind)) for k, kind in enumerate(matrix.kinds()))
    style = (
        "body{font-family:system-ui,sans-serif;margin:1.5em;color:#1b1b1b}table{border-collapse:collapse}"
        "td,th{border:1px solid #fff;padding:3px 5px;vertical-align:top;font-size:12px}"
        "th{background:#eee;writing-mode:vertical-rl;transform:rotate(180deg);white-space:nowrap;text-align:left}"
        "th.row,td.row{writing-mode:horizontal-tb;transform:none;text-align:left;background:#f7f7f7;width:20em;max-width:20em}"
        "th.row{white-space:normal;vertical-align:bottom}td.row{overflow-wrap:anywhere}"
        "td.row code{font-size:11px}td.row small{color:#555}"
        "td.cell{width:5.5em;min-width:5.5em}td.cell a{color:inherit;text-decoration:none}"
        "td.cell.probed{outline:2px dashed #000;outline-offset:-3px}"
        ".legend span{display:inline-block;padding:2px 8px;margin:2px;font-size:12px}"
        ".legend span.probed{outline:2px dashed #000}"
        "ol.prose{font-size:13px;max-width:60em}ol.prose li{margin:.15em 0}ol.prose b{font-weight:600}"
        + "".join(f".{name}{{background:{bg};color:{fg}}}" for name, (bg, fg, _) in COLOURS.items())
    )
    legend = "".join(f'<span class="{name}">{html.escape(text)}</span>' for name, (_, _, text) in COLOURS.items())
    return (
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>muongate compatibility matrix</title>"
        f"<style>{style}</style></head><body><h1>muongate compatibility matrix</h1>"
        f"<p class='legend'>{legend}</p>{tables}</body></html>\n"
    )


def _html_table(k: int, title: str, columns: list[str], rows: list[list[str]]) -> str:
    """The grid, a row header each (package, adapter, torch and backend), then the prose beneath it."""
    head = '<th class="row" scope="col">package, adapter, torch and backend</th>' + "".join(
        f'<th scope="col">{html.escape(c)}</th>' for c in columns[3:]
    )
    body, prose = [], []
    for i, row in enumerate(rows):
        package, adapter, ran = (html.escape(c) for c in row[:3])
        # an adapter that names no package of its own is named once
        spec = "" if package.startswith(adapter) else f"<code>{adapter}</code>"
        cells = [f'<td class="row"><b>{package}</b><br>{spec + "<br>" if spec else ""}<small>{ran}</small></td>']
        said: dict[str, list[str]] = {}  # a verdict's text → the columns it is the verdict of
        for column, text in zip(columns[3:], row[3:], strict=True):
            if not text.startswith(_PLAIN):
                said.setdefault(text, []).append(column)
        lines = list(said)
        for column, text in zip(columns[3:], row[3:], strict=True):
            short = html.escape(text.split(":", 1)[0])
            if text in said:
                short = f'<a href="#m{k}-{i}-{lines.index(text)}">{short}</a>'
            whole = html.escape(f"{column}: {text}")
            cells.append(f'<td class="cell {_status_class(text)}" title="{whole}">{short}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
        if lines:
            items = "".join(
                f'<li id="m{k}-{i}-{j}"><b>{html.escape(", ".join(said[text]))}</b>: {html.escape(text)}</li>'
                for j, text in enumerate(lines)
            )
            prose.append(f"<h3>{package} {spec}</h3><ol class='prose'>{items}</ol>")
    caption = html.escape(title.replace("`", ""))
    return f"<h2>{caption}</h2><table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>" + (
        f"<h2>{caption}: what each cell says</h2>{''.join(prose)}" if prose else ""
    )


def _status_class(text: str) -> str:
    """A cell's classes: its verdict's (``within causes``: ``within``; ``not judged``: ``judged``; ``not
    supported`` and ``not run``: ``not``); a cell not declared but tried has the tried verdict's, dashed."""
    tried = text.removeprefix("not declared: tried: ")
    words = tried.split(":", 1)[0].split()
    first = (
        {"within": "within", "not": "judged" if words[1:2] == ["judged"] else "not"}.get(words[0], words[0])
        if words
        else ""
    )
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
