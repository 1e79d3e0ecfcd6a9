"""From records (``reports.records``) to a summary: plain data, no rendering.

The renderers (``terminal``, ``markdown``, ``html``) read a ``RunSummary`` and nothing
else; ``files`` writes them, and ``figures.json``, to a report directory.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from reports.records import (
    CAUSE_REACH,
    Accepted,
    CaseResult,
    Comparison,
    Header,
    NegativeControl,
    Record,
    Routing,
    Scenario,
    Skip,
    Spectrum,
    Training,
    Unjudged,
)

#: The bars of a gate's max|diff| histogram; a bitwise comparison is its own bar, never
#: merged with small differences.
BUCKETS = ("bitwise", "<1e-9", "<1e-6", "<1e-4", "<1e-2", "<1", ">=1")


def diff_bucket(c: Comparison) -> str:
    """Which bar of the max|diff| histogram a comparison falls in."""
    if c.bitwise:
        return "bitwise"
    for bound, name in zip((1e-9, 1e-6, 1e-4, 1e-2, 1.0), BUCKETS[1:-1], strict=True):
        if c.max_abs_diff < bound:
            return name
    return ">=1"


def worse(a: float | None, b: float, pick: Callable[[float, float], float] = max) -> float:
    """``pick(a, b)`` (``b`` where ``a`` is ``None``), but NaN where either is: a NaN figure is
    the worst there is, and ``max`` alone keeps or drops it by the order its arguments came in."""
    if a is None:
        return b
    return math.nan if math.isnan(a) or math.isnan(b) else pick(a, b)


@dataclass
class GateSummary:
    """One gate's figures over all its cases. The worst figures are ``None`` where the gate
    made no comparison (a gate that judges only finiteness, say)."""

    gate: str
    cases: int = 0
    failed_cases: int = 0
    comparisons: int = 0
    bitwise: int = 0
    tolerance_passes: int = 0
    worst_abs_diff: float | None = None
    worst_ulp: float | None = None
    seconds: float = 0.0
    tiers: set[str] = field(default_factory=set)
    worst_rel_fro: float | None = None
    sv_min: float | None = None
    sv_max: float | None = None
    worst_orthogonality: float | None = None
    histogram: Counter[str] = field(default_factory=Counter)
    #: the failing cases by what they were: failed, hang, collective mismatch, abort, error
    statuses: Counter[str] = field(default_factory=Counter)
    #: whose code the gate judged (the candidate, a kernel, or a part of muongate)
    judged: set[str] = field(default_factory=set)
    #: cases changed to fit the candidate's declarations (``Impl.adapt``)
    narrowed_cases: int = 0
    #: against → [cases that compared with it, cases whose comparisons with it all passed]
    verdicts: dict[str, list[int]] = field(default_factory=dict)
    #: failing cases that compared nothing (a hang, an abort, an error before any comparison):
    #: not equal to anything, so they count in every "equal to" denominator
    uncompared_failures: int = 0
    #: cases per layout family (``fsdp``, ``3-D``, ``hsdp``, ``tp``, ``fsdp×tp``, ``ep×efsdp``)
    layouts: Counter[str] = field(default_factory=Counter)
    #: cases that differed only within the candidate's declared causes, and the largest fraction
    #: of a cause tier any of them reached
    within_causes: int = 0
    cause_reach: float | None = None
    #: cases that differed where no tier could judge them (``reports.records.Status``)
    not_judged: int = 0
    #: the finding the user accepted this gate's failures as (``--accept``), and why; empty: none
    accepted: str = ""

    def add(self, case: CaseResult) -> None:
        self.cases += 1
        if case.judged:
            self.judged.add(case.judged)
        self.narrowed_cases += bool(case.narrowed)
        if case.layout:
            self.layouts[case.layout] += 1
        for against in ("reference", "self"):
            verdict = case.verdict(against)
            if verdict is not None:
                tally = self.verdicts.setdefault(against, [0, 0])
                tally[0] += 1
                tally[1] += verdict
        self.seconds += case.seconds
        if case.tier:
            self.tiers.add(case.tier)
        self.failed_cases += case.failed
        if case.failed:
            self.statuses[case.status] += 1
            self.uncompared_failures += not case.comparisons
        elif case.status == "within causes":
            self.within_causes += 1
            reach = case.figures.get(CAUSE_REACH, 0.0)
            self.cause_reach = worse(self.cause_reach, reach)
        self.not_judged += case.status == "not judged"
        f = case.figures
        if "sv_min" in f:
            self.sv_min = worse(self.sv_min, f["sv_min"], min)
        if "sv_max" in f:
            self.sv_max = worse(self.sv_max, f["sv_max"])
        if "orthogonality_error" in f:
            self.worst_orthogonality = worse(self.worst_orthogonality or 0.0, f["orthogonality_error"])
        for c in case.comparisons:
            self.comparisons += 1
            self.tiers.add(c.tier)
            self.bitwise += c.bitwise
            self.tolerance_passes += c.passed and not c.bitwise
            self.worst_abs_diff = worse(self.worst_abs_diff or 0.0, c.max_abs_diff)
            self.worst_ulp = worse(self.worst_ulp or 0.0, c.max_ulp)
            self.worst_rel_fro = worse(self.worst_rel_fro or 0.0, c.rel_fro)
            self.histogram[diff_bucket(c)] += 1


@dataclass
class RunSummary:
    """A run: its header, every gate's figures, each failing gate's minimal case, and the rest."""

    header: Header
    gates: dict[str, GateSummary]
    failures: list[CaseResult] = field(default_factory=list)
    negative_controls: list[NegativeControl] = field(default_factory=list)
    skips: list[Skip] = field(default_factory=list)
    scenarios: list[Scenario] = field(default_factory=list)
    training: list[Training] = field(default_factory=list)
    spectra: list[Spectrum] = field(default_factory=list)
    #: the routing audits, the latest of each gate
    routings: list[Routing] = field(default_factory=list)
    #: cases that judged the session's candidate (``CaseResult.judged``), not counting those not judged
    candidate_cases: int = 0
    #: the parts of what the session was given that no gate judged, each once (``Unjudged``)
    unjudged: list[Unjudged] = field(default_factory=list)

    @property
    def unjudged_asked(self) -> list[Unjudged]:
        """The unjudged parts the user named: each fails the session unless ``--allow-unjudged``."""
        return [u for u in self.unjudged if u.asked]

    @property
    def empty(self) -> bool:
        return not (self.gates or self.scenarios or self.negative_controls)

    def ordered_gates(self) -> list[GateSummary]:
        """Failing gates first, then by name."""
        return sorted(self.gates.values(), key=lambda g: (g.failed_cases == 0, g.gate))


def summarize(records: Iterable[Record]) -> RunSummary:
    """Folds a stream's records into a summary.

    Hypothesis re-runs a failing test many times while it shrinks, and replays the
    minimal example last, so the last failing case of a gate is the one to show.
    """
    summary = RunSummary(Header(), {})
    last_failure: dict[tuple[str, str], CaseResult] = {}
    accepted: dict[str, str] = {}
    for r in records:
        if isinstance(r, Header):
            summary.header = r
        elif isinstance(r, CaseResult):
            summary.gates.setdefault(r.gate, GateSummary(r.gate)).add(r)
            judged_it = r.judged == CANDIDATE or bool(summary.header.engine and r.judged == summary.header.engine)
            summary.candidate_cases += judged_it and r.status != "not judged"
            if r.failed:  # one minimal case per kind of finding (hypothesis shrinks each)
                last_failure[(r.gate, r.finding)] = r
        elif isinstance(r, NegativeControl):
            summary.negative_controls.append(r)
        elif isinstance(r, Skip):
            summary.skips.append(r)
        elif isinstance(r, Scenario):
            summary.scenarios.append(r)
        elif isinstance(r, Training):  # a run writes its curve after every chunk: keep the latest
            summary.training = [t for t in summary.training if (t.gate, t.case) != (r.gate, r.case)] + [r]
        elif isinstance(r, Spectrum):
            summary.spectra.append(r)
        elif isinstance(r, Routing):
            summary.routings = [x for x in summary.routings if x.gate != r.gate] + [r]
        elif isinstance(r, Unjudged) and r not in summary.unjudged:  # each xdist worker writes its own
            summary.unjudged.append(r)
        elif isinstance(r, Accepted):
            accepted[r.gate] = f"{r.finding}: {r.reason}"
    for gate, why in accepted.items():
        if gate in summary.gates:
            summary.gates[gate].accepted = why
    summary.failures = [last_failure[k] for k in sorted(last_failure)]
    return summary


#: ``CaseResult.judged`` of a case that judged the session's ``--impl`` candidate (an engine gate's
#: names the ``--engine`` spec, as the header does)
CANDIDATE = "candidate"


def skip_reason(skip: Skip) -> str:
    """A skip's reason without the gate's name it starts with, so that gates skipped for one
    reason count together (``one_step: not run: …`` → ``not run: …``)."""
    head, sep, rest = skip.reason.partition(": not run: ")
    return f"not run: {rest}" if sep and " " not in head else skip.reason


def skip_groups(summary: RunSummary) -> list[tuple[str, list[Skip]]]:
    """The skips by reason (``skip_reason``), most first, each with the text to show: a reason only
    one skip has as it was written, naming its gate where it does (``hybrid_groups: not run: …``)."""
    groups: dict[str, list[Skip]] = {}
    for s in summary.skips:
        groups.setdefault(skip_reason(s), []).append(s)
    ordered = sorted(groups.items(), key=lambda item: -len(item[1]))
    return [(skips[0].reason if len(skips) == 1 else reason, skips) for reason, skips in ordered]


def test_names(skips: Iterable[Skip]) -> list[tuple[str, int]]:
    """The test functions ``skips`` skipped, each once with how many of its nodes, in the order
    first skipped: a node id's path left out, and its parameters where a function had several
    nodes, so that a reason skipping a whole suite names its few functions, not its every node."""
    nodes = [s.gate.rpartition("::")[2] or s.gate for s in skips]
    functions = Counter(node.partition("[")[0] for node in nodes)
    return list(Counter(n if functions[n.partition("[")[0]] == 1 else n.partition("[")[0] for n in nodes).items())


def unjudged_reason(summary: RunSummary) -> str:
    """Why a run judged nothing of its candidate, in one line; empty where it judged something."""
    if summary.candidate_cases:
        return ""
    parts = []
    not_judged = sum(g.not_judged for g in summary.gates.values())
    if not_judged:
        parts.append(f"{not_judged} case(s) not judged (a difference no tier could judge, or routes no state showed)")
    reasons = Counter(skip_reason(s) for s in summary.skips)
    if reasons:
        # a reason about the candidate (``not run: …``) before one about the session (``needs --nproc 4``)
        top = max(reasons, key=lambda r: (r.startswith("not run: "), reasons[r]))
        n = reasons[top]
        others = len(summary.skips) - n
        parts.append(
            f"{len(summary.skips)} gate test(s) skipped, {n} of them: {top}"
            + (f" (and {others} for {len(reasons) - 1} other reason(s))" if others else "")
        )
    return "nothing of the candidate was judged: " + ("; ".join(parts) or "no gate ran a case of it")


def unjudged_lines(unjudged: Iterable[Unjudged]) -> list[str]:
    """The ledger's unjudged parts, one line per reason: how many, whether the user named them,
    the reason, and the first few parts."""
    by: dict[tuple[bool, str], list[str]] = {}
    for u in unjudged:
        by.setdefault((u.asked, u.reason), []).append(u.part)
    lines = []
    for (asked, reason), parts in sorted(by.items(), key=lambda kv: (not kv[0][0], -len(kv[1]), kv[0][1])):
        shown = ", ".join(parts[:4]) + (f" and {len(parts) - 4} more" if len(parts) > 4 else "")
        lines.append(f"{len(parts)} {'named' if asked else 'declared'} part(s) not judged: {reason}: {shown}")
    return lines


def fmt(x: float | None) -> str:
    """A figure for a table: ``–`` where nothing was measured; ``nan``, ``inf`` and ``-inf`` as
    Python writes them (``-inf`` was ``inf`` here once, losing its sign)."""
    return "–" if x is None else f"{x:.3g}"


def cause_reach_text(reach: float | None) -> str:
    """How far into their causes' tier the cases within causes reached: ``≤ 0.74 of the tier``;
    ``equal in value`` where it is 0 (each of their differences was a zero's sign), which
    ``≤ 0 of the tier`` would leave the reader to work out."""
    if reach == 0.0:
        return "equal in value"
    return f"≤ {fmt(reach)} of the tier"


def encodable(text: str) -> str:
    """``text`` with each lone surrogate (output decoded with ``surrogateescape``) written as its
    escape, ``\\udcff``: a file, a terminal or a job summary written as UTF-8 refuses it whole."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def scenario_row(r: Scenario) -> tuple[str, str, str, str, str]:
    """A scenario as the report's columns (MoE deadlock reproductions, diagnoses, alternatives)."""
    env = " ".join(f"{k}={v}" for k, v in r.env.items())
    name = f"{r.scenario} [{r.wrapping} units, {r.variant} model{', ' + env if env else ''}]"
    return r.gate, name, r.outcome, f"{r.seconds:.1f}", r.detail


SCENARIO_COLUMNS = ("gate", "scenario", "outcome", "seconds", "what showed it")
ROUTING_COLUMNS = ("parameter", "declared", "stepped as", "verdict")
ROUTING_TITLE = "which algorithm stepped each parameter, as the candidate's state shows it"


def routing_caption(r: Routing) -> str:
    """What a routing table is of: the gate, whose code, and the case."""
    return f"{r.gate}: {r.judged or 'the candidate'} on {r.case}"


def routing_tally(r: Routing) -> str:
    """``19 parameters: 12 Muon, 7 AdamW as declared`` and how many were not."""
    declared = Counter(row[1] for row in r.rows if row[3] == "ok")
    tally = ", ".join(f"{n} {route}" for route, n in declared.most_common())
    off = Counter(row[3] for row in r.rows if row[3] != "ok")
    rest = "".join(f"; {n} {verdict}" for verdict, n in sorted(off.items()))
    n = len(r.rows)
    return f"{n} parameter{'' if n == 1 else 's'}: {tally or 'none'} as declared{rest}"


TRAINING_COLUMNS = ("gate", "case", "steps", "train bits/byte", "held-out bits/byte")
GATE_COLUMNS = (
    "gate",
    "judged",
    "tiers",
    "cases",
    "failed",
    "equal to",
    "bitwise",
    "max|diff|",
    "max ULP",
    "s",
)
#: What the gate table's columns mean, under it wherever it is shown.
GATE_LEGEND = (
    "judged: whose code the gate ran and judged (the candidate, a kernel, or muongate itself); cases: with how "
    "many were narrowed to fit the candidate's declarations; equal to: cases whose every comparison with "
    "the session's reference (ref), and with the candidate itself on one device (self, --against self), was within its tier, "
    "of the cases that compared with it or failed before comparing anything (a hang, an abort, an error), then "
    "those that differed only within the candidate's declared causes (green, with the largest fraction of a cause "
    "tier reached) and those that differed where no tier could judge them (not judged: neither green nor red); "
    "failed: failing cases, by what they were (failed: compared and differed; hang; collective mismatch; "
    "abort; error); bitwise: comparisons (a tensor of one step on one rank) with the same bits, of all made, "
    "and how many more passed a tolerance tier; max|diff|, max ULP: the gate's worst comparison "
    "(– where the gate compared nothing, e.g. where it judges only finiteness); s: seconds"
)


LAYOUT_ORDER = ("fsdp", "3-D", "own", "hsdp", "tp", "fsdp×tp", "hsdp×tp", "ep×efsdp")


def layout_counts(g: GateSummary) -> str:
    """``fsdp 40 · tp 90 · …``: the gate's cases per layout family, in a fixed order."""
    order = [f for f in LAYOUT_ORDER if f in g.layouts] + sorted(set(g.layouts) - set(LAYOUT_ORDER))
    return " · ".join(f"{f} {g.layouts[f]}" for f in order)


def layout_rows(summary: RunSummary) -> list[tuple[str, str]]:
    """(gate, its cases per layout family) for each gate that ran more than plain FSDP2."""
    return [(g.gate, layout_counts(g)) for g in summary.ordered_gates() if set(g.layouts) - {"fsdp"}]


def _verdicts(g: GateSummary) -> str:
    """``ref 26/160``: of the cases that compared with the reference or failed before comparing
    anything, those whose every comparison with it passed."""
    shown = [
        f"{name} {g.verdicts[a][1]}/{g.verdicts[a][0] + g.uncompared_failures}"
        for a, name in (("reference", "ref"), ("self", "self"))
        if a in g.verdicts
    ]
    if g.within_causes:
        shown.append(f"· {g.within_causes} within causes ({cause_reach_text(g.cause_reach)})")
    if g.not_judged:
        shown.append(f"· {g.not_judged} not judged")
    return " ".join(shown) or "–"


def gate_outcome(g: GateSummary) -> str:
    """The gate's outcome over its cases: ``differs`` (or the crash it had), ``accepted`` where the
    user accepted its failures as a known finding (``--accept``), ``not judged`` where no case was
    judged, ``within causes`` where some differed only within the declared causes, else
    ``bitwise`` or ``in tier``."""
    if g.failed_cases:
        if g.accepted:
            return "accepted"
        return g.statuses.most_common(1)[0][0] if g.statuses else "differs"
    if g.cases == g.not_judged:
        return "not judged"
    if g.within_causes:
        return "within causes"
    # a verdict the gate reached itself, in a tier it names (a band, the routing audit), is not a bitwise one
    return "in tier" if g.tolerance_passes or g.tiers - {"bitwise"} else "bitwise"


#: the outcomes a run's top line counts (``outcome_line``), in its order; a crash counts by its name after them
OUTCOMES = ("bitwise", "in tier", "within causes", "accepted", "not judged", "differ")
#: the outcomes the top line shows only where some gate had them
_SHOWN_IF_ANY = ("in tier", "accepted")
#: what ``--impl`` is when a session names none: a header naming it names no candidate of the user's
DEFAULT_IMPL = "distributed_impl:ShardedMuon"


def outcome_counts(summary: RunSummary) -> Counter[str]:
    """Gates by outcome (``gate_outcome``), a gate whose cases compared and differed as ``differ``."""
    return Counter("differ" if (o := gate_outcome(g)) in ("failed", "differs") else o for g in summary.gates.values())


def outcome_line(summary: RunSummary) -> str:
    """``12 gates: 9 bitwise, 1 within causes, 0 not judged, 2 differ``: every gate by outcome, ``in
    tier``, ``accepted`` and each crash (``1 hang``) only where some gate had it, and the parts the
    user named that no gate judged (the ledger); where no gate ran, that."""
    if not summary.gates:
        return "no gate ran a case"
    counts = outcome_counts(summary)
    shown = [f"{counts[o]} {o}" for o in OUTCOMES if counts[o] or o not in _SHOWN_IF_ANY]
    shown += [f"{n} {o}" for o, n in sorted(counts.items()) if o not in OUTCOMES]
    n = len(summary.gates)
    asked = len(summary.unjudged_asked)  # a part the user named and no gate judged: never green
    left = f"; {asked} named part(s) not judged" if asked else ""
    return f"{n} gate{'' if n == 1 else 's'}: " + ", ".join(shown) + left


def failure_word(summary: RunSummary, gate: str) -> str:
    """How a failing gate's minimal case is headed: ``FAILED``, or ``ACCEPTED (finding: why)``
    where the user accepted its failures as a known finding (``--accept``)."""
    g = summary.gates.get(gate)
    return f"ACCEPTED ({g.accepted})" if g is not None and g.accepted else "FAILED"


def names_candidate(h: Header) -> bool:
    """Whether the header names a candidate of the user's (``--impl``, ``--engine``), whose
    judging nothing is then worth saying first (``unjudged_reason``)."""
    return bool(h.engine) or (bool(h.impl) and h.impl != DEFAULT_IMPL)


def gate_row(g: GateSummary) -> tuple[str, ...]:
    return (
        g.gate,
        ", ".join(sorted(g.judged)) or "–",
        ", ".join(sorted(g.tiers)) or "–",
        f"{g.cases} ({g.narrowed_cases} narrowed)" if g.narrowed_cases else str(g.cases),
        ", ".join(f"{n} {status}" for status, n in g.statuses.most_common()) if g.statuses else str(g.failed_cases),
        _verdicts(g),
        f"{g.bitwise}/{g.comparisons}" + (f" +{g.tolerance_passes} in tier" if g.tolerance_passes else ""),
        fmt(g.worst_abs_diff),
        fmt(g.worst_ulp),
        f"{g.seconds:.1f}",
    )


def training_row(r: Training) -> tuple[str, str, str, str, str]:
    """A loss curve as the report's columns: first → last of each curve."""
    held = [v for v in r.held_out_bits if v is not None]

    def span(vs: list[float]) -> str:
        return f"{vs[0]:.3f} → {vs[-1]:.3f}" if vs else "–"

    return r.gate, r.case, str(len(r.train_bits)), span(list(r.train_bits)), span(held)


def identity(version: str, commit: str) -> str:
    """``0.2.0 (commit abc1234)``, or the version alone where no git checkout says more."""
    return version + (f" (commit {commit})" if commit and commit != "unknown" else "")


def title(h: Header) -> str:
    return (
        f"muongate {identity(h.muongate or '?', h.git_commit)}: torch {h.torch or '?'}, {h.backend or '?'} on {h.device or '?'}"
        + (f" ({h.arrangement})" if h.arrangement else "")
        + f", nproc {h.nproc or '?'}, hypothesis profile {h.hypothesis_profile or '?'}, "
        + (f"engine {h.engine}" if h.engine else f"candidate {h.impl or '?'}")
        + (f", kernel {h.kernel}" if h.kernel else "")
        + (", judged against itself on one device" if h.against == "self" else "")
        + (f", replaying the layout of {replayed_file(h)}" if h.replayed else "")
    )


def replayed_file(h: Header) -> str:
    """The capture a session replayed (``--layout-from``): its summary line starts with the path."""
    return h.replayed[0].split(": ", 1)[0] if h.replayed else ""
