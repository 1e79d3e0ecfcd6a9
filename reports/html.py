"""The self-contained HTML report: rich's own export of the summary tables, plus inline SVG
pictures where people would rather look than read. No scripts, no external files.

Pictures: for every gate, how the comparisons' max|diff| is distributed (a bitwise
comparison is its own bar, never merged with small differences); for every recorded
spectrum, the singular values of an orthogonalized matrix against the exact polar
factor's (all ones) and the quintic's known band.
"""

from __future__ import annotations

import html
import math
from collections import Counter
from typing import Any

from reports.summary import RunSummary

_BUCKETS = ["bitwise", "<1e-9", "<1e-6", "<1e-4", "<1e-2", "<1", ">=1"]


def diff_bucket(record: dict[str, Any]) -> str:
    """Which bar of the |diff| histogram a comparison record falls in."""
    if record["bitwise"]:
        return "bitwise"
    x = record["max_abs_diff"]
    for bound, name in ((1e-9, "<1e-9"), (1e-6, "<1e-6"), (1e-4, "<1e-4"), (1e-2, "<1e-2"), (1.0, "<1")):
        if x < bound:
            return name
    return ">=1"


def _histogram(gate: str, counts: Counter[str]) -> str:
    width, height, bar, room = 420, 150, 50, 16
    top = max(counts.values()) if counts else 1
    parts = [f'<svg width="{width}" height="{height + 40}" role="img" aria-label="max|diff| of {html.escape(gate)}">']
    for i, name in enumerate(_BUCKETS):
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


def _spectrum(record: dict[str, Any]) -> str:
    width, height, pad = 420, 180, 30
    values = sorted(record["singular_values"], reverse=True)
    lo_band, hi_band = record.get("band", (0.7, 1.2))
    y_max = max(1.5, max(values) * 1.05)

    def y(v: float) -> float:
        return pad + (height - 2 * pad) * (1 - v / y_max)

    n = len(values)
    points = " ".join(f"{pad + (width - 2 * pad) * (i / max(1, n - 1)):.1f},{y(v):.1f}" for i, v in enumerate(values))
    label = f"{record['gate']} {tuple(record['shape'])} {record.get('dtype', '')}: singular values, sorted"
    return (
        f'<svg width="{width}" height="{height}" role="img" aria-label="{html.escape(label)}">'
        f'<rect x="{pad}" y="{y(hi_band):.1f}" width="{width - 2 * pad}" height="{y(lo_band) - y(hi_band):.1f}" fill="#e3f2fd"/>'
        f'<line x1="{pad}" x2="{width - pad}" y1="{y(1.0):.1f}" y2="{y(1.0):.1f}" stroke="#555" stroke-dasharray="4 3"/>'
        f'<polyline points="{points}" fill="none" stroke="#1565c0" stroke-width="2"/>'
        f'<text x="{pad}" y="14" font-size="11">{html.escape(label)}</text>'
        f'<text x="{width - pad}" y="{y(1.0) - 4:.1f}" font-size="10" text-anchor="end">exact polar factor (1)</text>'
        f'<text x="{pad + 4}" y="{y(lo_band) - 4:.1f}" font-size="10">band {lo_band}–{hi_band}</text>'
        + "".join(
            f'<text x="{pad - 4}" y="{y(t) + 3:.1f}" font-size="10" text-anchor="end">{t:g}</text>'
            f'<line x1="{pad}" x2="{pad + 4}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#555"/>'
            for t in (0.0, 0.5, 1.0, 1.5)
        )
        + "</svg>"
    )


def _loss_curve(record: dict[str, Any]) -> str:
    """Training bits per byte at each step, and the held-out figure before and after."""
    width, height, pad = 420, 180, 34
    values = [float(v) for v in record["train_bits"]]
    held = [float(v) for v in record.get("held_out_bits", []) if v is not None]
    lo, hi = min(values + held), max(values + held)
    span = (hi - lo) or 1.0

    def x(i: float) -> float:
        return pad + (width - 2 * pad) * (i / max(1, len(values) - 1))

    def y(v: float) -> float:
        return pad + (height - 2 * pad) * (1 - (v - lo) / span)

    points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))
    dots = "".join(
        f'<circle cx="{x(i * (len(values) - 1)):.1f}" cy="{y(v):.1f}" r="4" fill="#c62828"/>'
        for i, v in enumerate(held)
    )
    label = f"{record['gate']}: {record['case']}"
    return (
        f'<svg width="{width}" height="{height}" role="img" aria-label="{html.escape(label)}">'
        f'<polyline points="{points}" fill="none" stroke="#1565c0" stroke-width="2"/>{dots}'
        f'<text x="{pad}" y="14" font-size="11">{html.escape(label[:70])}</text>'
        f'<text x="{pad - 4}" y="{y(hi) + 3:.1f}" font-size="10" text-anchor="end">{hi:.2f}</text>'
        f'<text x="{pad - 4}" y="{y(lo) + 3:.1f}" font-size="10" text-anchor="end">{lo:.2f}</text>'
        f'<text x="{width - pad}" y="{height - 6}" font-size="10" text-anchor="end">'
        f"step {len(values) - 1}; line: training bits/byte, dots: held-out</text>"
        "</svg>"
    )


def page(summary: RunSummary, tables_html: str, records: list[dict[str, Any]]) -> str:
    """The whole report page: the rich tables, then the pictures."""
    by_gate: dict[str, Counter[str]] = {}
    for r in records:
        if r.get("kind") == "comparison":
            by_gate.setdefault(r["gate"], Counter())[diff_bucket(r)] += 1
    spectra = [r for r in records if r.get("kind") == "spectrum"]
    histograms = "".join(f"<figure>{_histogram(g, c)}</figure>" for g, c in sorted(by_gate.items()))
    spectrum_svgs = "".join(f"<figure>{_spectrum(r)}</figure>" for r in spectra[:24])
    curves = "".join(f"<figure>{_loss_curve(r)}</figure>" for r in summary.training if r.get("train_bits"))
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>muongate equivalence report</title>"
        "<style>body{font-family:sans-serif;margin:1.5em}figure{display:inline-block;margin:.5em}"
        "h2{margin-top:1.5em}</style></head><body>"
        "<h1>muongate equivalence report</h1>"
        f"{tables_html}"
        "<h2>max|diff| per gate</h2>"
        f"{histograms or '<p>no comparisons recorded</p>'}"
        "<h2>Training loss (bits per byte)</h2>"
        f"{curves or '<p>no training recorded</p>'}"
        "<h2>Orthogonalized spectra against the float64 polar factor</h2>"
        f"{spectrum_svgs or '<p>no spectra recorded</p>'}"
        "</body></html>"
    )
