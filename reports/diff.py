"""Comparing two runs (a baseline and now), gate by gate, from their plain records.

A regression, with the margins it is judged by: a gate failing now that passed before; a
gate that was bitwise in every comparison and no longer is; a worst max|diff| or relative
Frobenius error more than ``ERROR_MARGIN`` (10%) above the baseline's; a singular-value
band wider by more than ``BAND_MARGIN`` (0.01) at either end; an orthogonality error more
than ``ERROR_MARGIN`` above the baseline's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rich.table import Table

from reports.summary import GateSummary, RunSummary

ERROR_MARGIN = 0.10
BAND_MARGIN = 0.01


def _grew(base: float, now: float) -> bool:
    """Whether ``now`` is past the margin above ``base``; a NaN now is worse than any number
    before it (a comparison with NaN alone is false, and would let it pass), and no worse than
    a NaN before."""
    if math.isnan(now) or math.isnan(base):
        return math.isnan(now) and not math.isnan(base)
    return now > base * (1 + ERROR_MARGIN) and now - base > 1e-12


@dataclass
class RunDiff:
    """What moved between a baseline run and this one."""

    new_failures: list[str] = field(default_factory=list)
    fixed: list[str] = field(default_factory=list)
    no_longer_bitwise: list[str] = field(default_factory=list)
    grown: list[tuple[str, float, float]] = field(default_factory=list)
    worse: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    recounted: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def regressed(self) -> bool:
        return bool(self.new_failures or self.no_longer_bitwise or self.grown or self.worse)

    def messages(self) -> list[str]:
        """One line per regression, saying what moved."""
        out = [f"{g}: fails now, passed in the baseline" for g in self.new_failures]
        out += [f"{g}: was bitwise in every comparison, no longer is" for g in self.no_longer_bitwise]
        out += [f"{g}: worst max|diff| {a:.3g} → {b:.3g} (margin {ERROR_MARGIN:.0%})" for g, a, b in self.grown]
        return out + self.worse


def diff_runs(base: RunSummary, now: RunSummary) -> RunDiff:
    """Gates failing now but not before, fixed ones, ones that lost bitwise, and ones whose
    worst max|diff| grew; gates present in only one run, or that ran another number of cases
    or comparisons, are listed, not judged."""
    d = RunDiff()
    for name in sorted(set(base.gates) | set(now.gates)):
        b, n = base.gates.get(name), now.gates.get(name)
        if b is None:
            d.added.append(name)
            continue
        if n is None:
            d.missing.append(name)
            continue
        if (b.cases, b.comparisons) != (n.cases, n.comparisons):
            d.recounted.append((name, b.cases, n.cases))
        if n.failed_cases and not b.failed_cases:
            d.new_failures.append(name)
        if b.failed_cases and not n.failed_cases:
            d.fixed.append(name)
        if b.comparisons and b.bitwise == b.comparisons and n.bitwise < n.comparisons:
            d.no_longer_bitwise.append(name)
        b_abs, n_abs = b.worst_abs_diff or 0.0, n.worst_abs_diff or 0.0
        if _grew(b_abs, n_abs):
            d.grown.append((name, b_abs, n_abs))
        b_fro, n_fro = b.worst_rel_fro or 0.0, n.worst_rel_fro or 0.0
        if _grew(b_fro, n_fro):
            d.worse.append(
                f"{name}: worst relative Frobenius error {b_fro:.3g} → {n_fro:.3g} (margin {ERROR_MARGIN:.0%})"
            )
        if _band_widened(b, n):
            d.worse.append(
                f"{name}: singular values [{b.sv_min:.3f}, {b.sv_max:.3f}] → [{n.sv_min:.3f}, {n.sv_max:.3f}] "
                f"(margin {BAND_MARGIN})"
            )
        bo, no = b.worst_orthogonality, n.worst_orthogonality
        if bo is not None and no is not None and _grew(bo, no):
            d.worse.append(f"{name}: ‖OOᵀ − I‖ {bo:.3g} → {no:.3g} (margin {ERROR_MARGIN:.0%})")
    return d


def _band_widened(b: GateSummary, n: GateSummary) -> bool:
    if b.sv_min is None or b.sv_max is None or n.sv_min is None or n.sv_max is None:
        return False
    if math.isnan(n.sv_min) or math.isnan(n.sv_max):  # as in _grew: NaN is past any band
        return not (math.isnan(b.sv_min) or math.isnan(b.sv_max))
    return n.sv_min < b.sv_min - BAND_MARGIN or n.sv_max > b.sv_max + BAND_MARGIN


def render_diff(d: RunDiff) -> Table:
    table = Table(title="baseline → now", title_justify="left")
    table.add_column("change")
    table.add_column("gates")
    rows = [
        ("new failures", ", ".join(d.new_failures)),
        ("no longer bitwise", ", ".join(d.no_longer_bitwise)),
        ("worst max|diff| grew", ", ".join(f"{g} ({a:.3g} → {b:.3g})" for g, a, b in d.grown)),
        ("error or band worse", "; ".join(d.worse)),
        ("fixed", ", ".join(d.fixed)),
        ("cases or comparisons counted differently", ", ".join(f"{g} ({a} → {b} cases)" for g, a, b in d.recounted)),
        ("only in baseline", ", ".join(d.missing)),
        ("only now", ", ".join(d.added)),
    ]
    for change, gates in rows:
        table.add_row(change, gates or "-")
    return table
