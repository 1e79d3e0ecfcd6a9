"""The HTML report: one self-contained page (no scripts, no external files) that reads as a
page: the run's header, semantic tables, a section per gate with its figures and its
max|diff| histogram, each failing gate's minimal case (with a chart of max|diff| by step
and tensor) and the command that reproduces it, then the loss curves and the orthogonalized
spectra as inline SVG.
"""

from __future__ import annotations

import html
import math
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from reports.records import CaseResult, Spectrum, Training
from reports.summary import (
    BUCKETS,
    GATE_COLUMNS,
    SCENARIO_COLUMNS,
    TRAINING_COLUMNS,
    GateSummary,
    RunSummary,
    encodable,
    fmt,
    gate_row,
    identity,
    layout_counts,
    scenario_row,
    training_row,
    worse,
)

_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em auto;max-width:80em;padding:0 1em;color:#1b1b1b}
table{border-collapse:collapse;margin:.5em 0 1.5em}th,td{border-bottom:1px solid #ddd;padding:.25em .6em;vertical-align:top}
thead th{background:#f3f3f3;text-align:left}td.num{text-align:right;font-variant-numeric:tabular-nums}
th[scope=row]{text-align:left;font-weight:normal;white-space:nowrap}
.fail{color:#b71c1c;font-weight:bold}.pass{color:#1b5e20}.skip{color:#8d6e00}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;white-space:pre-wrap}code{background:#f3f3f3;padding:0 .2em}
figure{display:inline-block;margin:.5em}section{border-top:1px solid #eee;margin-top:1em}dl{display:grid;grid-template-columns:max-content auto;gap:.1em 1em}dt{font-weight:bold}
"""


def anchor(gate: str) -> str:
    """The id of a gate's section: its name with anything but letters, digits, ``-`` and ``_`` as ``_``."""
    return "gate-" + re.sub(r"[^A-Za-z0-9_-]", "_", gate)


def _e(text: object) -> str:
    return html.escape(str(text))


def _table(
    caption: str, columns: Sequence[str], rows: Iterable[Sequence[str]], *, numeric: set[str], row_header: bool = True
) -> str:
    head = "".join(f'<th scope="col">{_e(c)}</th>' for c in columns)
    body = []
    for row in rows:
        cells = []
        for i, (col, value) in enumerate(zip(columns, row, strict=True)):
            if i == 0 and row_header:
                cells.append(f'<th scope="row">{value}</th>')
            else:
                cells.append(f'<td class="num">{value}</td>' if col in numeric else f"<td>{value}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f"<table><caption>{_e(caption)}</caption><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def _histogram(gate: str, counts: Counter[str]) -> str:
    width, height, bar, room = 420, 150, 50, 16
    top = max(counts.values()) if counts else 1
    parts = [f'<svg width="{width}" height="{height + 40}" role="img" aria-label="max|diff| of {html.escape(gate)}">']
    for i, name in enumerate(BUCKETS):
        n = counts.get(name, 0)
        h = 0 if n == 0 else max(2, round((height - room) * math.log1p(n) / math.log1p(top)))
        x = 10 + i * (bar + 8)
        colour = "#2e7d32" if name == "bitwise" else "#c62828"
        parts.append(f'<rect x="{x}" y="{height - h}" width="{bar}" height="{h}" fill="{colour}"/>')
        parts.append(f'<text x="{x + bar / 2}" y="{height - h - 3}" font-size="11" text-anchor="middle">{n}</text>')
        parts.append(
            f'<text x="{x + bar / 2}" y="{height + 14}" font-size="11" text-anchor="middle">{html.escape(name)}</text>'
        )
    parts.append(
        f'<text x="10" y="{height + 32}" font-size="11">{html.escape(gate)}: comparisons by max|diff| (log-scaled bars)</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


def _scale(lo: float, hi: float, start: float, length: float) -> Callable[[float], float]:
    """A chart's y: ``lo`` at ``start + length``, ``hi`` at ``start`` (an SVG's y grows down the
    page), ``lo`` and ``hi`` finite. What lies beyond either, an infinity too, is drawn at that
    edge; NaN is the caller's to leave out, as nowhere is right for it."""
    # by halves: hi - lo overflows to inf between the largest finite figures of either sign
    span = hi / 2 - lo / 2

    def at(v: float) -> float:
        t = 0.5 if span <= 0 else (v / 2 - lo / 2) / span
        return start + length * (1 - min(1.0, max(0.0, t)))

    return at


def _not_drawn(values: Iterable[float]) -> str:
    """What a chart's label says of its NaN figures, which it cannot place."""
    nan = sum(math.isnan(v) for v in values)
    return f"; {nan} NaN not drawn" if nan else ""


def _spectrum(record: Spectrum) -> str:
    width, height, pad = 420, 180, 30
    values = sorted((v for v in record.singular_values if not math.isnan(v)), reverse=True)
    finite = [v for v in values if math.isfinite(v)]
    lo_band, hi_band = record.band
    # a little room above the largest value, short of overflowing to inf
    top = min(max([1.5, *finite]) * 1.05, sys.float_info.max)
    y = _scale(min([0.0, *finite]), top, pad, height - 2 * pad)
    n = len(values)
    points = " ".join(f"{pad + (width - 2 * pad) * (i / max(1, n - 1)):.1f},{y(v):.1f}" for i, v in enumerate(values))
    label = f"{record.gate} {tuple(record.shape)} {record.dtype}: singular values, sorted" + _not_drawn(
        record.singular_values
    )
    band = ""
    if not (math.isnan(lo_band) or math.isnan(hi_band)):
        band_top, band_bottom = sorted((y(hi_band), y(lo_band)))
        band = f'<rect x="{pad}" y="{band_top:.1f}" width="{width - 2 * pad}" height="{band_bottom - band_top:.1f}" fill="#e3f2fd"/>'
    band_label = y(lo_band) if not math.isnan(lo_band) else height - pad
    return (
        f'<svg width="{width}" height="{height}" role="img" aria-label="{html.escape(label)}">'
        f"{band}"
        f'<line x1="{pad}" x2="{width - pad}" y1="{y(1.0):.1f}" y2="{y(1.0):.1f}" stroke="#555" stroke-dasharray="4 3"/>'
        f'<polyline points="{points}" fill="none" stroke="#1565c0" stroke-width="2"/>'
        f'<text x="{pad}" y="14" font-size="11">{html.escape(label)}</text>'
        f'<text x="{width - pad}" y="{y(1.0) - 4:.1f}" font-size="10" text-anchor="end">exact polar factor (1)</text>'
        f'<text x="{pad + 4}" y="{band_label - 4:.1f}" font-size="10">band {lo_band}–{hi_band}</text>'
        + "".join(
            f'<text x="{pad - 4}" y="{y(t) + 3:.1f}" font-size="10" text-anchor="end">{t:g}</text>'
            f'<line x1="{pad}" x2="{pad + 4}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#555"/>'
            for t in (0.0, 0.5, 1.0, 1.5)
        )
        + "</svg>"
    )


def _loss_curve(record: Training) -> str:
    """Training bits per byte at each step, and the held-out figure before and after; a NaN
    step breaks the line, an infinite one is drawn at the chart's edge."""
    width, height, pad = 420, 180, 34
    values = [float(v) for v in record.train_bits]
    held = [float(v) for v in record.held_out_bits if v is not None]
    finite = [v for v in values + held if math.isfinite(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
    y = _scale(lo, hi, pad, height - 2 * pad)

    def x(i: float) -> float:
        return pad + (width - 2 * pad) * (i / max(1, len(values) - 1))

    runs: list[list[str]] = [[]]
    for i, v in enumerate(values):
        if math.isnan(v):
            runs.append([])
        else:
            runs[-1].append(f"{x(i):.1f},{y(v):.1f}")
    lines = "".join(
        f'<polyline points="{" ".join(run)}" fill="none" stroke="#1565c0" stroke-width="2"/>' for run in runs if run
    )
    dots = "".join(
        f'<circle cx="{x(i * (len(values) - 1)):.1f}" cy="{y(v):.1f}" r="4" fill="#c62828"/>'
        for i, v in enumerate(held)
        if not math.isnan(v)
    )
    ticks = "".join(
        f'<text x="{pad - 4}" y="{y(v) + 3:.1f}" font-size="10" text-anchor="end">{v:.2f}</text>'
        for v in ((hi, lo) if finite else ())
    )
    label = f"{record.gate}: {record.case}"
    return (
        f'<svg width="{width}" height="{height}" role="img" aria-label="{html.escape(label)}">'
        f"{lines}{dots}"
        f'<text x="{pad}" y="14" font-size="11">{html.escape(label[:70])}</text>{ticks}'
        f'<text x="{width - pad}" y="{height - 6}" font-size="10" text-anchor="end">'
        f"step {len(values) - 1}; line: training bits/byte, dots: held-out{_not_drawn(values + held)}</text>"
        "</svg>"
    )


def _diff_grid(case: CaseResult) -> str:
    """A failing case's comparisons (those it was judged on) as a grid: a row per tensor, a
    column per step, each cell the worst max|diff| over the ranks (green where every rank
    passed, else a red that darkens with log10 max|diff|, darkest where it is infinite or
    NaN), its figure in the cell's title."""
    # under --against self the case was judged against the candidate on one device
    judged = "self" if any(c.against == "self" for c in case.comparisons) else "reference"
    worst: dict[tuple[str, int], tuple[float, bool]] = {}
    for c in case.comparisons:
        if c.against != judged:
            continue
        diff, ok = worst.get((c.tensor, c.step), (0.0, True))
        worst[(c.tensor, c.step)] = (worse(diff, c.max_abs_diff), ok and c.passed)
    if not worst:
        return ""
    tensors = sorted({t for t, _ in worst})
    steps = sorted({s for _, s in worst})
    cell, left, top = 22, max(60, 7 * max(len(t) for t in tensors)), 30
    # wide enough for its two lines of text whatever the grid's size
    width, height = max(560, left + cell * len(steps) + 10), top + cell * len(tensors) + 28
    failing = [d for d, ok in worst.values() if not ok]
    diffs = [d for d in failing if math.isfinite(d) and d > 0]
    lo, hi = (math.log10(min(diffs)), math.log10(max(diffs))) if diffs else (0.0, 0.0)
    label = f"max|diff| by step and tensor: {case.case}"
    parts = [f'<svg width="{width}" height="{height}" role="img" aria-label="{_e(label)}">']
    parts.append(
        '<text x="0" y="12" font-size="11">max|diff| by step (columns) and tensor (rows), worst over ranks</text>'
    )
    for j, step in enumerate(steps):
        parts.append(
            f'<text x="{left + j * cell + cell / 2}" y="{top - 4}" font-size="10" text-anchor="middle">{step}</text>'
        )
    for i, tensor in enumerate(tensors):
        y = top + i * cell
        parts.append(
            f'<text x="{left - 4}" y="{y + cell * 0.65:.1f}" font-size="10" text-anchor="end">{_e(tensor)}</text>'
        )
        for j, step in enumerate(steps):
            if (tensor, step) not in worst:
                continue
            diff, ok = worst[(tensor, step)]
            if ok:
                fill, title = "#c8e6c9", "passed" + (f", max|diff| {fmt(diff)}" if diff else ", bitwise")
            else:
                if not math.isfinite(diff):
                    t = 1.0
                elif hi == lo or diff <= 0:
                    t = 0.5
                else:
                    t = (math.log10(diff) - lo) / (hi - lo)
                fill, title = (
                    f"rgb({255 - round(80 * t)},{round(190 * (1 - t))},{round(190 * (1 - t))})",
                    f"max|diff| {fmt(diff)}",
                )
            parts.append(
                f'<rect x="{left + j * cell}" y="{y}" width="{cell - 2}" height="{cell - 2}" fill="{fill}">'
                f"<title>{_e(tensor)} step {step}: {title}</title></rect>"
            )
    shades = [f"{min(diffs):.2g} to {max(diffs):.2g}" if lo != hi else f"{max(diffs):.2g}"] if diffs else []
    shades += ["darkest: inf or nan"] if any(not math.isfinite(d) for d in failing) else []
    scale = f" ({'; '.join(shades)})" if shades else ""
    parts.append(
        f'<text x="0" y="{height - 6}" font-size="10">green: every rank passed; red: failed, darker for a larger '
        f"max|diff|{scale}</text></svg>"
    )
    return "".join(parts)


def _gate_cells(g: GateSummary) -> list[str]:
    cells = [_e(c) for c in gate_row(g)]
    status = "fail" if g.failed_cases else "pass"
    cells[0] = f'<a class="{status}" href="#{anchor(g.gate)}">{_e(g.gate)}</a>'
    return cells


def _gate_section(summary: RunSummary, g: GateSummary) -> str:
    verdict = (
        f'<span class="fail">{g.failed_cases} of {g.cases} cases failed</span>'
        if g.failed_cases
        else f'<span class="pass">all {g.cases} cases passed</span>'
    )
    parts = [
        f'<section id="{anchor(g.gate)}"><h3>{_e(g.gate)}</h3><p>{verdict}; {g.comparisons} comparisons, {g.bitwise} bitwise, {g.tolerance_passes} within a tolerance tier; tiers: {_e(", ".join(sorted(g.tiers)) or "none")}.</p>'
    ]
    if g.layouts:
        parts.append(f"<p>cases per layout family: {_e(layout_counts(g))}</p>")
    for f in summary.failures:
        if f.gate == g.gate:
            parts.append(
                f"<details open><summary>minimal failing case: {_e(f.finding)}</summary>"
                f"<p><code>{_e(f.case)}</code></p>"
                + (f"<p>narrowed for the candidate: {_e('; '.join(f.narrowed))}</p>" if f.narrowed else "")
                + (f"<figure>{_diff_grid(f)}</figure>" if f.comparisons else "")
                + f"<pre>{_e(f.message[:4000])}</pre>"
                + (f"<p>reproduce: <code>{_e(f.reproduce)}</code></p>" if f.reproduce else "")
                + "</details>"
            )
    if g.histogram:
        parts.append(f"<figure>{_histogram(g.gate, g.histogram)}</figure>")
    parts.append("</section>")
    return "".join(parts)


def page(summary: RunSummary) -> str:
    """The whole report page."""
    h = summary.header
    facts = [
        ("muongate", identity(h.muongate or "?", h.git_commit)),
        ("candidate", h.impl + (f", kernel {h.kernel}" if h.kernel else "")),
        ("torch", h.torch),
        ("backend", f"{h.backend} on {', '.join(h.devices) or h.device}"),
        ("ranks (--nproc)", str(h.nproc)),
        ("hypothesis profile", h.hypothesis_profile + (f", seed {h.hypothesis_seed}" if h.hypothesis_seed else "")),
        ("written", h.time),
    ]
    gates = summary.ordered_gates()
    failed = sum(1 for g in gates if g.failed_cases)
    verdict = (
        f'<p class="fail">{failed} of {len(gates)} gates failed.</p>'
        if failed
        else f'<p class="pass">All {len(gates)} gates passed.</p>'
    )
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>muongate equivalence report</title><style>{_STYLE}</style></head><body>"
        "<header><h1>muongate equivalence report</h1><dl>"
        + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts)
        + f"</dl>{verdict}</header><main>",
        "<h2>Gates</h2>",
        _table(
            "every gate, failing gates first",
            GATE_COLUMNS,
            [_gate_cells(g) for g in gates],
            numeric=set(GATE_COLUMNS) - {"gate", "tiers", "judged"},
        ),
    ]
    if summary.negative_controls:
        rows = [
            (
                _e(c.gate.removeprefix("negative:")),
                '<span class="pass">yes</span>' if c.detected else '<span class="fail">NO</span>',
                f"<code>{_e(c.case)}</code>",
            )
            for c in summary.negative_controls
        ]
        parts += [
            "<h2>Negative controls</h2>",
            _table(
                "known-wrong variants the gates must catch", ("control", "caught", "minimal case"), rows, numeric=set()
            ),
        ]
    if summary.scenarios:
        scenario_rows = [[_e(c) for c in scenario_row(r)] for r in summary.scenarios]
        parts += [
            "<h2>MoE empty-expert scenarios</h2>",
            _table("what each run did", SCENARIO_COLUMNS, scenario_rows, numeric={"seconds"}),
        ]
    if summary.training:
        training_rows = [[_e(c) for c in training_row(t)] for t in summary.training]
        parts += [
            "<h2>Training</h2>",
            _table("bits per byte, first → last step", TRAINING_COLUMNS, training_rows, numeric={"steps"}),
        ]
        parts.append("".join(f"<figure>{_loss_curve(r)}</figure>" for r in summary.training if r.train_bits))
    if summary.skips:
        parts.append(
            "<h2>Skipped</h2><ul>"
            + "".join(f'<li class="skip"><code>{_e(s.gate)}</code>: {_e(s.reason)}</li>' for s in summary.skips)
            + "</ul>"
        )
    parts.append("<h2>Each gate</h2>")
    parts += [_gate_section(summary, g) for g in gates]
    if summary.spectra:
        parts.append("<h2>Orthogonalized spectra against the float64 polar factor</h2>")
        parts.append("".join(f"<figure>{_spectrum(r)}</figure>" for r in summary.spectra[:24]))
    parts.append("</main></body></html>")
    return encodable("".join(parts))
