"""The HTML report: one self-contained page (no scripts, no external files) that reads as a
page: the run's header and its gates by outcome in one line, the gate table, each failure's
minimal case right under it (with a map of where its tensors differ, piece by piece, a chart
of max|diff| by step and tensor, and the command that reproduces it), one chart of every
comparison's max|diff|, then skips by reason, a section per gate (a failing gate keeps its
own chart), the loss curves and the orthogonalized spectra as inline SVG.
"""

from __future__ import annotations

import html
import math
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from reports.records import CaseResult, Comparison, Header, Spectrum, Training
from reports.summary import (
    BUCKETS,
    GATE_COLUMNS,
    GATE_LEGEND,
    OUTCOMES,
    ROUTING_COLUMNS,
    ROUTING_TITLE,
    SCENARIO_COLUMNS,
    TRAINING_COLUMNS,
    GateSummary,
    RunSummary,
    cause_reach_text,
    encodable,
    failure_word,
    fmt,
    gate_outcome,
    gate_row,
    identity,
    layout_counts,
    names_candidate,
    outcome_counts,
    outcome_line,
    routing_caption,
    scenario_row,
    skip_groups,
    training_row,
    unjudged_lines,
    unjudged_reason,
    worse,
)

_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em auto;max-width:120em;padding:0 1em;color:#1b1b1b}
p,li,dd{max-width:80em}
table{border-collapse:collapse;margin:.5em 0 1em;display:block;max-width:100%;overflow-x:auto;font-size:.92em}th,td{border-bottom:1px solid #ddd;padding:.25em .35em;vertical-align:top}
thead th{background:#f3f3f3;text-align:left}td.num{text-align:right;font-variant-numeric:tabular-nums}
caption{text-align:left;color:#555;padding-bottom:.2em}th[scope=row]{text-align:left;font-weight:normal}
.fail{color:#b71c1c;font-weight:bold}.pass{color:#1b5e20}.skip{color:#8d6e00}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;white-space:pre-wrap}code{background:#f3f3f3;padding:0 .2em}
figure{display:inline-block;margin:.5em;vertical-align:top}figcaption{font-size:.8em;color:#444;max-width:44em}
section{border-top:1px solid #eee;margin-top:1em}dl{display:grid;grid-template-columns:max-content auto;gap:.1em 1em}dt{font-weight:bold}
.badge{display:inline-block;padding:0 .45em;border-radius:.25em;white-space:nowrap;font-size:.9em}
.o-bitwise,.o-tier{background:#e8f5e9;color:#1b5e20}.o-causes{background:#e8f5e9;color:#1b5e20;box-shadow:inset 0 0 0 1px #66bb6a}
.o-unjudged{background:#fff8e1;color:#7a5d00;box-shadow:inset 0 0 0 1px #f9a825}.o-accepted{background:#fff3e0;color:#8a3c00;box-shadow:inset 0 0 0 1px #ef6c00}.o-fail{background:#ffebee;color:#b71c1c;font-weight:bold}
.note{color:#2e7d32;font-size:.85em}p.outcomes{font-size:1.15em;margin:.8em 0}
.unjudged{background:#fff8e1;border-left:.4em solid #f9a825;padding:.5em .8em;font-weight:bold}
.failure{border:1px solid #ef9a9a;border-left:.4em solid #c62828;padding:.2em 1em .6em;margin:1em 0}
.failure h3{color:#b71c1c;margin:.4em 0}.eq{display:inline-block;min-width:8em}.mapnote{font-size:.8em;color:#444;max-width:60em}details.skips summary{cursor:pointer}details.skips ul{margin:.2em 0 .6em}
"""

#: a gate's outcome (``gate_outcome``) as the class of its badge: green bitwise or in tier, green
#: with a note within causes, yellow not judged, red whatever differed or crashed
_OUTCOME_CLASS = {
    "bitwise": "o-bitwise",
    "in tier": "o-tier",
    "within causes": "o-causes",
    "accepted": "o-accepted",
    "not judged": "o-unjudged",
}


def anchor(gate: str) -> str:
    """The id of a gate's section: its name with anything but letters, digits, ``-`` and ``_`` as ``_``."""
    return "gate-" + re.sub(r"[^A-Za-z0-9_-]", "_", gate)


def _e(text: object) -> str:
    return html.escape(str(text))


def _verdict_cell(verdict: str) -> str:
    """A routing verdict, coloured as the report colours verdicts."""
    css = {"ok": "pass", "wrong": "fail"}.get(verdict, "skip")
    return f'<span class="{css}">{_e(verdict)}</span>'


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


def _histogram(name: str, counts: Counter[str], label: str) -> str:
    """Comparisons by max|diff| bucket, log-scaled bars: bitwise green, the rest grey (a comparison
    that differs in some bit passed or failed by its tier, which the bucket does not say)."""
    width, height, bar, room = 420, 150, 50, 16
    top = max(counts.values()) if counts else 1
    parts = [f'<svg width="{width}" height="{height + 40}" role="img" aria-label="max|diff| of {_e(name)}">']
    for i, bucket in enumerate(BUCKETS):
        n = counts.get(bucket, 0)
        h = 0 if n <= 0 else max(2, round((height - room) * math.log1p(n) / math.log1p(top)))
        x = 10 + i * (bar + 8)
        colour = "#2e7d32" if bucket == "bitwise" else "#78909c"
        parts.append(f'<rect x="{x}" y="{height - h}" width="{bar}" height="{h}" fill="{colour}"/>')
        parts.append(f'<text x="{x + bar / 2}" y="{height - h - 3}" font-size="11" text-anchor="middle">{n}</text>')
        parts.append(
            f'<text x="{x + bar / 2}" y="{height + 14}" font-size="11" text-anchor="middle">{_e(bucket)}</text>'
        )
    parts.append(f'<text x="10" y="{height + 32}" font-size="11">{_e(label)}</text>')
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
    judged = _judged_against(case)
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


def _judged_against(case: CaseResult) -> str:
    """What the case's verdict rests on (``CaseResult.against``); in a stream from before it was
    written, ``self`` where it compared with the candidate itself (``--against self``)."""
    return case.against or ("self" if any(c.against == "self" for c in case.comparisons) else "reference")


def _whole_shape(case: CaseResult, tensor: str) -> tuple[int, ...] | None:
    """The whole tensor's shape as the case names it (``w0[7, 5] float32 · …``; a state, ``w0.momentum_buffer``,
    has its parameter's shape), or ``None`` where the case does not name it."""
    base = re.escape(tensor.split(".", 1)[0])
    found = re.search(rf"(?:^|[\s,(]){base}\[(\d+(?:, \d+)*)\]", case.case)
    return tuple(int(side) for side in found[1].split(", ")) if found else None


def _rows_cols(shape: tuple[int, ...]) -> tuple[int, int]:
    """A tensor as the map draws it: its last dimension as columns, every other flattened into rows."""
    if len(shape) == 1:
        return shape[0], 1
    return math.prod(shape[:-1]), shape[-1]


def _flat_index(index: tuple[int, ...] | None, shape: tuple[int, ...]) -> tuple[int, int] | None:
    """``index`` of a piece of ``shape`` as (row, column) of the map, or ``None`` where it is not in it."""
    if (
        index is None
        or len(index) != len(shape)
        or not shape
        or any(not 0 <= i < n for i, n in zip(index, shape, strict=True))
    ):
        return None
    if len(shape) == 1:
        return index[0], 0
    row = 0
    for i, n in zip(index[:-1], shape[:-1], strict=True):
        row = row * n + i
    return row, index[-1]


def _chunk_sizes(n: int, world: int) -> list[int]:
    """The rows of each rank's piece under ``Shard(0)``: torch.chunk on dim 0, rank r from row r·⌈n/w⌉."""
    step = -(-n // world) if world else 0
    return [max(0, min(step, n - r * step)) for r in range(world)]


def _red(t: float) -> str:
    """A red from light (``t`` 0) to dark (``t`` 1)."""
    return f"rgb({255 - round(80 * t)},{round(190 * (1 - t))},{round(190 * (1 - t))})"


def _piece_map(case: CaseResult, tensor: str, step: int, pieces: list[Comparison]) -> str:
    """Where ``tensor`` differs at ``step``, as a figure: each rank's piece a band of rows of the whole
    tensor (stacked in rank order, as FSDP2's ``Shard(0)`` lays them out) where the pieces stack into
    the shape the case names, else each piece on its own; a failing band red, fuller for more of its
    elements differing and darker for a larger max|diff|, its worst element marked."""
    shapes = [c.shape for c in pieces]
    whole = _whole_shape(case, tensor)
    stacked = (
        all(len(sh) >= 1 and sh[1:] == shapes[0][1:] for sh in shapes)
        and whole is not None
        and len(pieces) > 1
        and whole == (sum(sh[0] for sh in shapes), *shapes[0][1:])
    )
    # the geometry: a band per piece, stacked; else a panel per piece, side by side
    panels: list[tuple[Comparison, int, int, int]] = []  # piece, its first row, rows, columns
    row = 0
    for c in pieces:
        rows, cols = _rows_cols(c.shape) if c.shape else (1, 1)
        panels.append((c, row if stacked else 0, rows, cols))
        row += rows
    total_rows = row if stacked else max((p[2] for p in panels), default=1)
    cols = max((p[3] for p in panels), default=1)
    box = 260 if stacked else max(60, 260 // max(1, len(panels)))
    cw = min(24.0, box / max(1, cols))
    ch = min(24.0, 260 / max(1, total_rows))
    left, top, gap = 34, 24, 14

    def fill(c: Comparison) -> tuple[str, float]:
        if c.passed:
            return "#c8e6c9", 1.0
        # on a fixed scale, 1e-8 to 1: two pieces that differ alike look alike, whatever the others
        d = c.max_abs_diff
        t = 1.0 if not math.isfinite(d) else 0.0 if d <= 0 else min(1.0, max(0.0, (math.log10(d) + 8) / 8))
        return _red(t), 0.3 + 0.7 * min(1.0, max(0.0, c.mismatch_fraction))

    parts: list[str] = []
    labels: list[tuple[float, float, str]] = []  # y of its band, x, text
    x0: float = left
    for c, first, rows, pcols in panels:
        y = top + first * ch
        w, h = pcols * cw, rows * ch
        colour, opacity = fill(c)
        if not stacked:
            where = f"its piece {list(c.shape)}"
        else:
            where = f"rows {first}–{first + rows - 1}" if rows else "no rows (an empty piece)"
        differ = f"{c.mismatches}/{c.numel} differ, max|diff| {fmt(c.max_abs_diff)}" if not c.passed else "passed"
        title = f"rank {c.rank}: {where}; {differ}"
        parts.append(
            f'<rect x="{x0:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{colour}" '
            f'fill-opacity="{opacity:.2f}" stroke="#777" stroke-width="0.5"><title>{_e(title)}</title></rect>'
        )
        if cw >= 6 and ch >= 6:  # small enough to show its elements: their grid
            parts += [
                f'<line x1="{x0 + j * cw:.1f}" x2="{x0 + j * cw:.1f}" y1="{y:.1f}" y2="{y + h:.1f}" stroke="#fff" stroke-opacity="0.6"/>'
                for j in range(1, pcols)
            ]
            parts += [
                f'<line x1="{x0:.1f}" x2="{x0 + w:.1f}" y1="{y + i * ch:.1f}" y2="{y + i * ch:.1f}" stroke="#fff" stroke-opacity="0.6"/>'
                for i in range(1, rows)
            ]
        at = _flat_index(c.worst_index, c.shape)
        if at is not None and not c.passed:
            cx, cy = x0 + (at[1] + 0.5) * cw, y + (at[0] + 0.5) * ch
            r = max(3.0, min(cw, ch) * 0.35)
            cross = f"M{cx - r:.1f},{cy - r:.1f}L{cx + r:.1f},{cy + r:.1f}M{cx - r:.1f},{cy + r:.1f}L{cx + r:.1f},{cy - r:.1f}"
            worst = (
                f"rank {c.rank} worst at {list(c.worst_index or ())}: expected {c.expected_at_worst!r} "
                f"got {c.actual_at_worst!r}"
            )
            # white under black: seen on the lightest band and on the darkest
            parts.append(
                f'<path d="{cross}" stroke="#fff" stroke-width="4"/><path d="{cross}" stroke="#000" '
                f'stroke-width="2"><title>{_e(worst)}</title></path>'
            )
        if stacked:  # the boundary: where this rank's piece starts
            parts.append(
                f'<line x1="{x0 - 6}" x2="{x0 + cols * cw:.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="#000" stroke-width="1.5"/>'
            )
            parts.append(f'<text x="{x0 - 8}" y="{y + 4:.1f}" font-size="10" text-anchor="end">{first}</text>')
            labels.append((y + h / 2, x0 + cols * cw + 8, f"rank {c.rank} · {where} · {differ}"))
        else:
            parts.append(f'<text x="{x0:.1f}" y="{top + h + 14:.1f}" font-size="10">rank {c.rank}: {_e(differ)}</text>')
            x0 += w + 24
    right = x0 + (cols * cw + 8 if stacked else 0)
    last: float = top - gap
    for y, x, text in labels:  # a label at its band, or below the one before where bands are thin
        last = max(y + 3, last + gap)
        parts.append(f'<text x="{x:.1f}" y="{last:.1f}" font-size="10">{_e(text)}</text>')
    if stacked and all(first < total_rows for _, first, _, _ in panels):  # else an empty last piece numbered it
        parts.append(
            f'<text x="{left - 8}" y="{top + total_rows * ch + 4:.1f}" font-size="10" text-anchor="end">{total_rows}</text>'
        )
    height = max(top + total_rows * ch + (8 if stacked else 22), last + 8)
    width = max(right + (300 if stacked else 0), 320)
    head = f"{tensor} step {step}: {total_rows} × {cols}" if stacked else f"{tensor} step {step}: each rank's piece"
    svg = (
        f'<svg width="{width:.0f}" height="{height:.0f}" role="img" aria-label="{_e("where " + head)}">'
        f'<text x="{left}" y="14" font-size="11">{_e(head)} (rows down, columns across)</text>{"".join(parts)}</svg>'
    )
    if stacked:
        chunked = whole is not None and [sh[0] for sh in shapes] == _chunk_sizes(whole[0], len(shapes))
        drawn = "its ranks' pieces as bands of its rows" + (
            ", as FSDP2's Shard(0) lays them out" if chunked else ", stacked in rank order"
        )
        flat = whole is not None and len(whole) > 2
        drawn += f" (dimensions {list(whole or ())[:-1]} flattened into rows)" if flat else ""
    elif whole is None or any(sh != whole for sh in shapes):
        drawn = "each rank's piece on its own: where it sits in the whole tensor is not recorded"
    else:
        drawn = "each rank compared the whole tensor"
    return (
        f'<figure class="map">{svg}<figcaption>Where <code>{_e(tensor)}</code> differs at step {step}: '
        f"{_e(drawn)}.</figcaption></figure>"
    )


#: how to read the maps (``_piece_map``), once under them
_MAP_NOTE = (
    "How to read a map: a band is one rank's piece of the tensor, its rows down and its columns across, the "
    "pieces stacked in rank order; FSDP2's Shard(0) lays them out with torch.chunk on dim 0, rank r from row "
    "r·⌈n/w⌉, and the number at a boundary is the row where the next piece starts. A failing piece is red, "
    "fuller for a larger fraction of its elements differing and darker for a larger max|diff| (lightest at "
    "1e-8 or less, darkest at 1 or more, inf or NaN); a green one passed; × marks a piece's worst element. "
    "Drawn from each rank's comparison (its piece's shape, how many of its elements differ, max|diff| and the "
    "worst element): which other elements differ is not recorded."
)


def _where_maps(case: CaseResult, most: int = 3) -> str:
    """A map (``_piece_map``) for each tensor that differed, at the first step it did (a bug's
    first sign: later steps carry it on), the first ``most`` tensors by name."""
    judged = _judged_against(case)
    first: dict[str, int] = {}
    for c in case.comparisons:
        if c.against == judged and not c.passed and c.mismatches > 0:
            first[c.tensor] = min(first.get(c.tensor, c.step), c.step)
    maps = []
    for tensor in sorted(first)[:most]:
        ranks: dict[int, Comparison] = {}
        for c in case.comparisons:
            if c.tensor == tensor and c.step == first[tensor] and c.against == judged:
                ranks.setdefault(c.rank, c)
        maps.append(_piece_map(case, tensor, first[tensor], [ranks[r] for r in sorted(ranks)]))
    more = len(first) - most
    note = f'<p class="mapnote">{_e(_MAP_NOTE)}</p>' if maps else ""
    return (
        "".join(maps)
        + note
        + (f"<p>{more} more tensor(s) differ: the message below lists them.</p>" if more > 0 else "")
    )


def _badge(g: GateSummary) -> str:
    """The gate's outcome (``gate_outcome``) as a coloured word, with how far inside its causes' tier."""
    outcome = gate_outcome(g)
    shown = "differs" if outcome == "failed" else outcome
    badge = f'<span class="badge {_OUTCOME_CLASS.get(outcome, "o-fail")}">{_e(shown)}</span>'
    if outcome == "within causes" and g.cause_reach is not None:
        return f'{badge}<br><span class="note">{_e(cause_reach_text(g.cause_reach))}</span>'
    return badge


def _gate_cells(g: GateSummary) -> list[str]:
    cells = [_e(c) for c in gate_row(g)]
    status = "fail" if g.failed_cases else "pass"
    cells[0] = f'<a class="{status}" href="#{anchor(g.gate)}">{_e(g.gate)}</a>'
    # "equal to" is a sentence where cases were within causes or not judged: room to read it
    equal = re.sub(r"(ref|self) ", r"\1&nbsp;", cells[5])
    cells[5] = f'<span class="eq">{equal}</span>'
    # the table fits the window by wrapping its cells: a count stays with its word where it does
    # (``12 (5 narrowed)``, ``1 hang, 1 abort``, ``+3 in tier``), not split from it
    for i in (3, 4, 6):
        cells[i] = re.sub(r"(\d+) (?=[a-z])", r"\1&nbsp;", cells[i].replace(" in tier", " in&nbsp;tier"))
    return [cells[0], _badge(g), *cells[1:]]


def _verdict(g: GateSummary) -> str:
    """The gate's outcome in words, on its section."""
    outcome = gate_outcome(g)
    unjudged = f"; {g.not_judged} not judged (no tier could judge them)" if g.not_judged else ""
    if g.failed_cases:
        kinds = ", ".join(f"{n} {status}" for status, n in g.statuses.most_common())
        return f'<span class="fail">{g.failed_cases} of {g.cases} cases failed ({_e(kinds)})</span>{unjudged}'
    if outcome == "not judged":
        return f'<span class="badge o-unjudged">none of {g.cases} cases judged</span>: each differed where no tier could judge it'
    if outcome == "within causes":
        reach = f", {cause_reach_text(g.cause_reach)}" if g.cause_reach is not None else ""
        return (
            f'<span class="pass">no case failed</span>: {g.within_causes} of {g.cases} differ only within the '
            f'candidate\'s declared causes<span class="note">{_e(reach)}</span>{unjudged}'
        )
    if not g.comparisons:
        return f'<span class="pass">all {g.cases} cases passed</span> by the gate\'s own verdict (nothing compared){unjudged}'
    how = "every comparison bitwise" if outcome == "bitwise" else "within their tiers"
    judged = f"{g.cases - g.not_judged} judged" if g.not_judged else str(g.cases)
    return f'<span class="pass">all {judged} cases passed, {how}</span>{unjudged}'


def _gate_section(summary: RunSummary, g: GateSummary) -> str:
    parts = [
        f'<section id="{anchor(g.gate)}"><h3>{_e(g.gate)}</h3><p>{_verdict(g)}; {g.comparisons} comparisons, '
        f"{g.bitwise} bitwise, {g.tolerance_passes} within a tolerance tier; tiers: "
        f"{_e(', '.join(sorted(g.tiers)) or 'none')}.</p>"
    ]
    if g.layouts:
        parts.append(f"<p>cases per layout family: {_e(layout_counts(g))}</p>")
    found = [i for i, f in enumerate(summary.failures) if f.gate == g.gate]
    if found:
        links = ", ".join(f'<a href="#failure-{i}">{_e(summary.failures[i].finding)}</a>' for i in found)
        parts.append(f"<p>minimal failing case(s), under the gate table: {links}</p>")
    if g.failed_cases and g.histogram:  # a gate that failed keeps its own chart; the rest share one
        label = f"{g.gate}: comparisons by max|diff| (log-scaled bars)"
        parts.append(f"<figure>{_histogram(g.gate, g.histogram, label)}</figure>")
    parts.append("</section>")
    return "".join(parts)


def _failure(summary: RunSummary, i: int, f: CaseResult) -> str:
    """A failure's minimal case, as the terminal shows it under the gate table, with its pictures."""
    tried = summary.gates[f.gate].failed_cases if f.gate in summary.gates else 0
    return (
        f'<div class="failure" id="failure-{i}"><h3>{_e(failure_word(summary, f.gate))} <a href="#{anchor(f.gate)}">{_e(f.gate)}</a>: '
        f"{_e(f.finding)}</h3><p>{tried} failing case(s) while shrinking; minimal case:</p>"
        f"<p><code>{_e(f.case)}</code></p>"
        + (f"<p>narrowed for the candidate: {_e('; '.join(f.narrowed))}</p>" if f.narrowed else "")
        + (_where_maps(f) + f"<figure>{_diff_grid(f)}</figure>" if f.comparisons else "")
        + f"<pre>{_e(f.message[:4000])}</pre>"
        + (f"<p>reproduce: <code>{_e(f.reproduce)}</code></p>" if f.reproduce else "")
        + "</div>"
    )


def _outcomes(summary: RunSummary) -> str:
    """The top line: every gate by outcome, each count in its outcome's colour."""
    counts = outcome_counts(summary)
    line = _e(outcome_line(summary))
    for outcome in [*OUTCOMES, *counts]:
        if counts[outcome]:
            css = _OUTCOME_CLASS.get(outcome, "o-fail")
            word = f"{counts[outcome]} {outcome}"
            line = line.replace(_e(word), f'<span class="badge {css}">{_e(word)}</span>', 1)
    return f'<p class="outcomes">{line}</p>'


def _skips(summary: RunSummary) -> str:
    """Skips by reason, most first: a count per reason, the gate tests it skipped folded under it."""
    items = "".join(
        f'<details class="skips"><summary class="skip">{len(skips)} gate test(s): {_e(text)}</summary><ul>'
        + "".join(f"<li><code>{_e(s.gate)}</code></li>" for s in skips)
        + "</ul></details>"
        for text, skips in skip_groups(summary)
    )
    return f"<h2>Skipped: {len(summary.skips)} gate test(s)</h2>{items}"


def _replayed(h: Header) -> str:
    """What a replayed capture kept, mesh by mesh and parameter by parameter (``harness.replay``)."""
    if len(h.replayed) < 2:
        return ""
    items = "".join(f"<li>{_e(line)}</li>" for line in h.replayed[1:])
    return f"<details><summary>what the replay kept of the captured layout</summary><ul>{items}</ul></details>"


def page(summary: RunSummary) -> str:
    """The whole report page."""
    h = summary.header
    facts = [
        ("muongate", identity(h.muongate or "?", h.git_commit)),
        ("candidate", (f"engine {h.engine}" if h.engine else h.impl) + (f", kernel {h.kernel}" if h.kernel else "")),
        ("torch", h.torch),
        (
            "backend",
            f"{h.backend} on {', '.join(h.devices) or h.device}" + (f": {h.arrangement}" if h.arrangement else ""),
        ),
        ("ranks (--nproc)", str(h.nproc)),
        ("CPU", h.cpu or "–"),
        ("hypothesis profile", h.hypothesis_profile + (f", seed {h.hypothesis_seed}" if h.hypothesis_seed else "")),
        ("written", h.time),
    ]
    if h.replayed:
        facts.append(("layout replayed from", h.replayed[0]))
    gates = summary.ordered_gates()
    why = unjudged_reason(summary) if names_candidate(h) else ""
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>muongate equivalence report</title><style>{_STYLE}</style></head><body>"
        "<header><h1>muongate equivalence report</h1><dl>"
        + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts)
        + "</dl>"
        + _outcomes(summary)
        + (f'<p class="unjudged">NOT JUDGED: {_e(why)}</p>' if why else "")
        + "".join(f'<p class="unjudged">NOT JUDGED: {_e(line)}</p>' for line in unjudged_lines(summary.unjudged))
        + _replayed(h)
        + "</header><main>",
    ]
    if gates:  # a run where no gate ran a case has said so in its outcome line
        parts += [
            "<h2>Gates</h2>",
            _table(
                "every gate, failing gates first",
                ("gate", "outcome", *GATE_COLUMNS[1:]),
                [_gate_cells(g) for g in gates],
                numeric=set(GATE_COLUMNS) - {"gate", "tiers", "judged", "equal to"},
            ),
            f"<details><summary>what the columns say</summary><p>{_e(GATE_LEGEND)}</p></details>",
        ]
    parts += [_failure(summary, i, f) for i, f in enumerate(summary.failures)]
    everything: Counter[str] = Counter()
    for g in gates:
        everything.update(g.histogram)
    if everything:
        compared = sum(everything.values())
        label = f"all {len(gates)} gates: {compared} comparisons by max|diff| (log-scaled bars)"
        parts.append(
            f"<h2>Differences</h2><figure>{_histogram('all gates', everything, label)}<figcaption>Every comparison "
            "(a tensor of one step on one rank) of every gate by its max|diff|: bitwise in green; a grey one "
            "differs in some bit, and passed or failed by its tier, as the gate table says. A gate that failed "
            "has its own chart in its section.</figcaption></figure>"
        )
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
    for routing in summary.routings:
        routing_rows = [
            [_e(name), _e(declared), _e(stepped), _verdict_cell(verdict)]
            for name, declared, stepped, verdict in routing.rows
        ]
        parts += [
            f"<h2>Routing</h2><p>{_e(routing_caption(routing))}</p>",
            _table(ROUTING_TITLE, ROUTING_COLUMNS, routing_rows, numeric=set()),
        ]
    if summary.skips:
        parts.append(_skips(summary))
    if gates:
        parts.append("<h2>Each gate</h2>")
        parts += [_gate_section(summary, g) for g in gates]
    if summary.spectra:
        parts.append("<h2>Orthogonalized spectra against the float64 polar factor</h2>")
        parts.append("".join(f"<figure>{_spectrum(r)}</figure>" for r in summary.spectra[:24]))
    parts.append("</main></body></html>")
    return encodable("".join(parts))
