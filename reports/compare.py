"""Comparing two runs (a baseline and now), gate by gate, from their plain records."""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.table import Table

from reports.summary import RunSummary


@dataclass
class RunDiff:
    """What moved between a baseline run and this one."""

    new_failures: list[str] = field(default_factory=list)
    fixed: list[str] = field(default_factory=list)
    no_longer_bitwise: list[str] = field(default_factory=list)
    grown: list[tuple[str, float, float]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)

    @property
    def regressed(self) -> bool:
        return bool(self.new_failures or self.no_longer_bitwise or self.grown)


def diff_runs(base: RunSummary, now: RunSummary) -> RunDiff:
    """Gates failing now but not before, fixed ones, ones that lost bitwise, and ones whose
    worst max|diff| grew; gates present in only one run are listed, not judged."""
    d = RunDiff()
    for name in sorted(set(base.gates) | set(now.gates)):
        b, n = base.gates.get(name), now.gates.get(name)
        if b is None:
            d.added.append(name)
            continue
        if n is None:
            d.missing.append(name)
            continue
        if n.failed_cases and not b.failed_cases:
            d.new_failures.append(name)
        if b.failed_cases and not n.failed_cases:
            d.fixed.append(name)
        if b.comparisons and b.bitwise == b.comparisons and n.bitwise < n.comparisons:
            d.no_longer_bitwise.append(name)
        if n.worst_abs_diff > b.worst_abs_diff:
            d.grown.append((name, b.worst_abs_diff, n.worst_abs_diff))
    return d


def render_diff(d: RunDiff) -> Table:
    table = Table(title="baseline → now", title_justify="left")
    table.add_column("change")
    table.add_column("gates")
    rows = [
        ("new failures", ", ".join(d.new_failures)),
        ("no longer bitwise", ", ".join(d.no_longer_bitwise)),
        ("worst max|diff| grew", ", ".join(f"{g} ({a:.3g} → {b:.3g})" for g, a, b in d.grown)),
        ("fixed", ", ".join(d.fixed)),
        ("only in baseline", ", ".join(d.missing)),
        ("only now", ", ".join(d.added)),
    ]
    for change, gates in rows:
        table.add_row(change, gates or "-")
    return table
