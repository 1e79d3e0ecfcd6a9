"""The compatibility matrix (``harness.matrix``) as a terminal table, Markdown and HTML: a row
per adapter, a column per gate and per layout family, each cell a verdict and its figure; one
table per kind of candidate (optimizers through ``--impl``, kernels through ``--kernel``),
since the two meet different gates."""

from __future__ import annotations

import dataclasses
import html
import json
from dataclasses import dataclass, field
from typing import Any

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
    #: the muongate commit its run ran at (its records' header)
    commit: str = ""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Row:
        cells = {k: {name: Cell(**c) for name, c in data[k].items()} for k in ("gates", "layouts")}
        return cls(**{**data, **cells})


#: the kinds of row, in the order their tables come, with each table's title
KINDS = {"optimizer": "Optimizers (`--impl`)", "kernel": "Newton–Schulz kernels (`--kernel`)"}


@dataclass(frozen=True)
class Matrix:
    rows: list[Row]
    #: what made it (``harness.matrix``): its command, commit, date and machine
    run: dict[str, str] = field(default_factory=dict)
    #: adapter spec → column (a gate, or ``layout: …``) → the numbers of the findings its cell
    #: shows, where a reader wrote them down (the docs' numbered findings: the grid links to them)
    findings: dict[str, dict[str, list[int]]] = field(default_factory=dict)

    def to_json(self) -> str:
        """The whole matrix, as ``from_json`` reads it back (``matrix.json``: what a page's grid is drawn from)."""
        rows = [dataclasses.asdict(r) for r in self.rows]
        return json.dumps({"run": self.run, "findings": self.findings, "rows": rows}, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Matrix:
        data = json.loads(text)
        rows = [Row.from_json(r) for r in data["rows"]]
        findings = {
            spec: {column: list(ns) for column, ns in cells.items()} for spec, cells in data.get("findings", {}).items()
        }
        return cls(rows, dict(data.get("run", {})), findings)

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


#: a verdict's colour in the HTML grid, its text's, and what it means (the legend), in the words
#: of the report's outcomes: greens for a pass (darkest bitwise), amber for a finding the user
#: accepted, yellow for not judged, red and purple for findings, grey for what did not run
COLOURS = {
    "bitwise": ("#2e7d32", "#fff", "bitwise: every comparison had the same bits"),
    "holds": ("#66bb6a", "#fff", "holds: the gate's own verdict, nothing compared (an input refused by name)"),
    "tier": ("#aed581", "#1b1b1b", "in tier: within a named tolerance tier"),
    "within": ("#dcedc8", "#1b5e20", "within causes: differs only as the adapter's declared causes explain"),
    "accepted": ("#ffb74d", "#1b1b1b", "accepted: differs, as a finding the run's --accept file names"),
    "judged": ("#fdd835", "#1b1b1b", "not judged: differs where no tier can judge it"),
    "differs": ("#c62828", "#fff", "differs: a comparison differed"),
    "crashes": ("#6a1b9a", "#fff", "crashes: hang, abort, collective mismatch or error"),
    "not": ("#e0e0e0", "#333", "not supported (the adapter declares it does not) or not run"),
    "probed": ("#fff", "#000", "dashed border: not declared by the adapter, tried anyway"),
}
#: cells whose whole verdict their first words say: no line of prose beneath the grid
_PLAIN = ("bitwise", "holds", "not run")
#: the grid's style, each rule under ``{scope}`` (the page's body, or the block a docs page holds it in)
_STYLE = (
    "{scope} table.mg{{border-collapse:collapse}}"
    "{scope} table.mg td,{scope} table.mg th{{border:1px solid #fff;padding:3px 5px;vertical-align:top;font-size:12px}}"
    "{scope} table.mg th{{background:#eee;writing-mode:vertical-rl;transform:rotate(180deg);white-space:nowrap;"
    "text-align:left}}"
    "{scope} table.mg th.row,{scope} table.mg td.row{{writing-mode:horizontal-tb;transform:none;text-align:left;"
    "background:#f7f7f7;width:20em;max-width:20em}}"
    "{scope} table.mg th.row{{white-space:normal;vertical-align:bottom}}{scope} table.mg td.row{{overflow-wrap:anywhere}}"
    "{scope} table.mg td.row code{{font-size:11px}}{scope} table.mg td.row small{{color:#555}}"
    "{scope} table.mg td.cell{{width:5.5em;min-width:5.5em}}{scope} table.mg td.cell a{{color:inherit;text-decoration:none}}"
    "{scope} table.mg td.cell.probed{{outline:2px dashed #000;outline-offset:-3px}}"
    "{scope} .legend span{{display:inline-block;padding:2px 8px;margin:2px;font-size:12px}}"
    "{scope} .legend span.probed{{outline:2px dashed #000}}"
    "{scope} ol.prose{{font-size:13px;max-width:60em}}{scope} ol.prose li{{margin:.15em 0}}"
    "{scope} ol.prose b{{font-weight:600}}"
)


def render_html(matrix: Matrix) -> str:
    """One page (no scripts): what made it, the legend, then ``render_grid``'s grids and prose."""
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>muongate compatibility matrix</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:1.5em;color:#1b1b1b}</style></head><body>"
        f"<h1>muongate compatibility matrix</h1>{render_grid(matrix, 'body')}</body></html>\n"
    )


def render_grid(matrix: Matrix, scope: str = ".muongate-matrix", anchors: str = "m") -> str:
    """The matrix as an HTML block of its own (no scripts), for a page or a docs page: what made it,
    the legend, and a grid per kind of row, a row per adapter and a column per gate and layout
    family, each cell its verdict's colour and first words; beneath it, the prose: what each cell
    that is not plainly bitwise says, a cell's identical verdicts in a row said once. A cell links
    to its line, and shows its whole verdict on hover (``title``). Its style applies under
    ``scope`` only (a docs page's own tables keep theirs); its lines' ids begin with ``anchors``
    (a page that holds several grids gives each its own)."""
    # a cell tried where its adapter declared nothing keeps its verdict's colour, dashed (the legend's
    # "probed" swatch alone is white)
    style = _STYLE.format(scope=scope) + "".join(
        f"{scope} {'.legend span' if name == 'probed' else ''}.{name}{{background:{bg};color:{fg}}}"
        for name, (bg, fg, _) in COLOURS.items()
    )
    legend = "".join(f'<span class="{name}">{html.escape(text)}</span>' for name, (_, _, text) in COLOURS.items())
    made = " · ".join(html.escape(f"{k}: {v}") for k, v in matrix.run.items() if v)
    tables = "".join(
        _html_table(f"{anchors}{k}", KINDS[kind], *matrix.table(kind), matrix.findings)
        for k, kind in enumerate(matrix.kinds())
    )
    block = f"<style>{style}</style>" + (f"<p><small>{made}</small></p>" if made else "")
    block += f"<p class='legend'>{legend}</p>{tables}"
    return block if scope == "body" else f'<div class="{scope.lstrip(".")}">{block}</div>'


def _html_table(
    k: str, title: str, columns: list[str], rows: list[list[str]], findings: dict[str, dict[str, list[int]]]
) -> str:
    """The grid, a row header each (package, adapter, torch and backend), then the prose beneath
    it, each line linked to the numbered findings (``Matrix.findings``) of its cells."""
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
            if not text.startswith(_PLAIN) or "not judged" in text:
                said.setdefault(text, []).append(column)
        lines = list(said)
        for column, text in zip(columns[3:], row[3:], strict=True):
            short = html.escape(text.split(":", 1)[0])
            if text in said:
                short = f'<a href="#{k}-{i}-{lines.index(text)}">{short}</a>'
            whole = html.escape(f"{column}: {text}")
            cells.append(f'<td class="cell {_status_class(text)}" title="{whole}">{short}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
        if lines:
            numbered = findings.get(row[1], {})
            items = "".join(
                f'<li id="{k}-{i}-{j}"><b>{html.escape(", ".join(said[text]))}</b>: {html.escape(text)}'
                f"{_finding_links(numbered, said[text])}</li>"
                for j, text in enumerate(lines)
            )
            prose.append(f"<h3>{package} {spec}</h3><ol class='prose'>{items}</ol>")
    caption = html.escape(title.replace("`", ""))
    return (
        f"<h2>{caption}</h2><table class='mg'><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
        + (f"<h2>{caption}: what each cell says</h2>{''.join(prose)}" if prose else "")
    )


def _finding_links(numbered: dict[str, list[int]], columns: list[str]) -> str:
    """Links to the numbered findings of ``columns`` (a docs page's ``#finding-N``), if any."""
    found = sorted({n for c in columns for n in numbered.get(c, ())})
    return "".join(f' (<a href="#finding-{n}">finding {n}</a>)' for n in found)


def _status_class(text: str) -> str:
    """A cell's classes: its verdict's (``within causes``: ``within``; ``in tier``: ``tier``; ``not judged``: ``judged``; ``not
    supported`` and ``not run``: ``not``); a cell not declared but tried has the tried verdict's, dashed."""
    tried = text.removeprefix("not declared: tried: ")
    words = tried.split(":", 1)[0].split()
    first = (
        {"within": "within", "in": "tier", "not": "judged" if words[1:2] == ["judged"] else "not"}.get(
            words[0], words[0]
        )
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
