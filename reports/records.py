"""Every record a run produces, in one place: one frozen dataclass per kind.

A stream (``results.jsonl``) is one JSON object per line; its first line is a ``Header``
with the schema version. Each record has a ``kind`` and one serialisation pair,
``to_json`` / ``from_json``. A field at its declared default is left out of the JSON
(most comparisons are bitwise, and a bitwise comparison has no figures to speak of), and
``from_json`` puts it back. No record refers to another line, so a line cut short by a
crash costs that record only.

Kinds:

``header``
    once per run: versions, backend, devices, world size, profile, candidate, commit.
``case``
    one case, stored once: its gate, what differs from the defaults, the verdict, and
    every ``Comparison`` it made (a tensor of one step on one rank). A case's comparisons
    repeat themselves: the same tensors, shapes and verdicts at every step and on every
    rank. So they are written as a table, ``{"rows": [...], "at": [...]}``: each distinct
    comparison less its step and rank once, as a short array (``Comparison.ROW``), and each
    comparison as ``[index, step, rank]`` less trailing zeros (a bare index where both are 0).
``skip``, ``scenario``, ``training``, ``spectrum``, ``negative_control``, ``routing``
    a skipped gate and why; what an MoE scenario did; a loss curve; singular values of an
    orthogonalized matrix; a known-wrong variant and whether the gates caught it.
``accepted``
    a gate whose failures the user accepted as a known finding (``--accept``).
``unjudged``
    the ledger's other side: a part of what the session was given (a captured parameter or
    mesh, a declared layout) that no gate judged, and why.

Schema 1 (muongate before the records had a home) repeated the case text on every
comparison; ``upgrade_v1`` reads it. Schema 2 wrote each comparison as an object of its
own: about 63 bytes each in the CI main job, against about 19 in tables (3.27 MB of
stream then, 1.62 MB now). ``CaseResult.from_json`` reads both forms. A stream of a newer
schema is refused by name.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar

SCHEMA = 3
#: the schemas ``decode`` reads: 1 through ``upgrade_v1``, 2 and 3 as they are
READS = (1, 2, 3)

TierKind = Literal["bitwise", "tolerance", "oracle", "edge"]
#: How a case ended. ``passed``: every comparison was bitwise or within its named tier;
#: ``within causes``: it differs from the reference only where the candidate's declared causes
#: reach, and within their calibrated tier (``harness.verdicts.causes.judge_causes``), green;
#: ``not judged``: it differs where no tier can judge it (a bf16 weight of such a candidate),
#: neither green nor red; ``failed``: it ran and some comparison did not pass (or the gate's
#: own verdict failed); ``hang``: ranks sat in collectives that could not complete;
#: ``collective mismatch``: ranks disagreed about a collective and were caught at it;
#: ``abort``: a rank was killed by a signal; ``error``: a rank raised.
Status = Literal["passed", "within causes", "not judged", "failed", "hang", "collective mismatch", "abort", "error"]
#: the statuses that are green: bitwise or in a tier, or within the candidate's declared causes
GREEN: frozenset[str] = frozenset({"passed", "within causes"})
#: the statuses that are no failure: green, or unjudged
NOT_FAILED: frozenset[str] = GREEN | {"not judged"}

R = TypeVar("R", bound="Record")


@dataclass(frozen=True)
class Record:
    """The serialisation every kind shares (``kind`` is a class constant)."""

    kind: ClassVar[str] = ""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.fields_json()}

    def fields_json(self) -> dict[str, Any]:
        """The fields that differ from their defaults, as JSON values (a nested record is written so)."""
        return {name: _plain(value) for name, value in self.changed()}

    def changed(self) -> Iterator[tuple[str, Any]]:
        """Each field not at its default, and its value."""
        for name, default in _defaults(type(self)).items():
            value = getattr(self, name)
            if not _is_default(value, default):
                yield name, value

    @classmethod
    def from_json(cls: type[R], data: Mapping[str, Any]) -> R:
        names = _defaults(cls)
        return cls(**{k: _tuples(v) for k, v in data.items() if k in names})


_REQUIRED = object()
_DEFAULTS: dict[type[Record], dict[str, Any]] = {}


def _defaults(cls: type[Record]) -> dict[str, Any]:
    """Each field's default, in declaration order (``_REQUIRED`` where it has none)."""
    if cls not in _DEFAULTS:
        _DEFAULTS[cls] = {f.name: _default(f) for f in dataclasses.fields(cls)}
    return _DEFAULTS[cls]


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return _REQUIRED


def _is_default(value: Any, default: Any) -> bool:
    """Whether ``value`` is ``default`` exactly, so leaving it out loses nothing: of the same
    type (``1`` is not ``1.0``, nor ``True``) and sign (``-0.0`` is not ``0.0``)."""
    if type(value) is not type(default) or value != default:
        return False
    return not isinstance(value, float) or math.copysign(1.0, value) == math.copysign(1.0, default)


def _plain(value: Any) -> Any:
    if isinstance(value, Record):
        return value.fields_json()
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _tuples(value: Any) -> Any:
    """JSON lists back to the tuples the records hold (shapes, indices)."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


@dataclass(frozen=True)
class Header(Record):
    """What ran, where, with what: written once, first."""

    kind: ClassVar[str] = "header"
    schema: int = SCHEMA
    muongate: str = ""
    git_commit: str = "unknown"
    torch: str = ""
    backend: str = ""
    device: str = ""
    devices: tuple[str, ...] = ()
    #: how the ranks share their devices where they do (``harness.ranks.relay.arrangement``), else ""
    arrangement: str = ""
    nproc: int = 0
    hypothesis_profile: str = ""
    hypothesis_seed: str | None = None
    impl: str = ""
    #: the reference class the candidate was judged against (``--reference``; ``harness.algorithms``)
    reference: str = "reference:Muon"
    kernel: str | None = None
    #: what the optimizer gates judged against: ``reference`` or ``self`` (``--against``)
    against: str = "reference"
    time: str = ""
    #: the CPU the ranks and the reference computed on: processor, instruction set, BLAS, oneDNN,
    #: cores and threads a rank (``harness.runinfo.cpu_line``); a kernel's choice can follow each
    cpu: str = ""
    #: the features and layouts the candidate did not declare and ran anyway (``--probe-undeclared``)
    probed: tuple[str, ...] = ()
    #: the engine the engine gates judged (``--engine``); the session then judged no candidate
    engine: str = ""
    #: a replayed capture (``--layout-from``): the file, then what each mesh and parameter kept
    #: and did not (``harness.replay``)
    replayed: tuple[str, ...] = ()

    def fields_json(self) -> dict[str, Any]:
        return {"schema": self.schema, **super().fields_json()}  # readers dispatch on it: always written


@dataclass(frozen=True)
class Comparison(Record):
    """One tensor of one step on one rank: the figures and the verdict (``harness.verdicts.compare``)."""

    kind: ClassVar[str] = "comparison"
    tensor: str
    shape: tuple[int, ...]
    step: int = 0
    rank: int = 0
    dtype: str = "float32"
    tier: str = "bitwise"
    tier_kind: TierKind = "bitwise"
    bitwise: bool = True
    passed: bool = True
    max_abs_diff: float = 0.0
    max_ulp: float = 0.0
    mismatches: int = 0
    rel_fro: float = 0.0
    worst_index: tuple[int, ...] | None = None
    expected_at_worst: float | None = None
    actual_at_worst: float | None = None
    all_zero: bool = False
    note: str = ""
    #: what the candidate was compared with: ``reference`` (``reference.Muon``) or ``self``
    #: (the same candidate on one device, ``--against self``)
    against: str = "reference"
    #: of a comparison that differed: ``‖actual − expected‖`` over this piece, and how far the
    #: expected piece moved from its start (a parameter's value before the first step; zero for
    #: a state), where the task gave one. Summed over the ranks' pieces, the two set a
    #: difference against the change (``harness.verdicts.causes.beyond_causes``).
    diff_norm: float = 0.0
    change_norm: float = 0.0

    @property
    def numel(self) -> int:
        n = 1
        for side in self.shape:
            n *= side
        return n

    @property
    def mismatch_fraction(self) -> float:
        return self.mismatches / self.numel if self.numel else 0.0

    #: The order of a comparison's fields in its case's table (``CaseResult``): what it
    #: compared, what a bitwise comparison may add, then the figures of one that differed;
    #: trailing defaults are left out, and step and rank are written per comparison. Only ever
    #: appended to: another order is another schema.
    ROW: ClassVar[tuple[str, ...]] = (
        "tensor", "shape", "dtype", "note", "all_zero", "against", "tier", "tier_kind", "bitwise", "passed",
        "max_abs_diff", "max_ulp", "mismatches", "rel_fro", "worst_index", "expected_at_worst", "actual_at_worst",
        "diff_norm", "change_norm",
    )  # fmt: skip

    def to_row(self) -> list[Any]:
        """The fields but step and rank in ``ROW`` order, as JSON values, trailing defaults left out."""
        defaults = _defaults(type(self))
        values = [getattr(self, name) for name in self.ROW]
        while values and _is_default(values[-1], defaults[self.ROW[len(values) - 1]]):
            values.pop()
        return [_plain(v) for v in values]

    @classmethod
    def from_row(cls, row: Sequence[Any], step: int = 0, rank: int = 0) -> Comparison:
        # A longer row (fields appended by a later muongate of this schema) keeps what this one knows.
        known = dict(zip(cls.ROW, row, strict=False))
        return cls(**{k: _tuples(v) for k, v in known.items()}, step=step, rank=rank)

    def line(self) -> str:
        """The comparison in one line, as a failure message lists it; one that could not compare
        element by element (another shape) says only why, with no figures it did not measure."""
        head = f"{self.tensor} step {self.step} rank {self.rank} [{self.tier}]"
        if not self.passed and not self.mismatches and self.note:
            return f"{head}: {self.note}"
        where = ""
        if self.worst_index is not None:
            where = (
                f", worst at {list(self.worst_index)}: expected {self.expected_at_worst!r} got {self.actual_at_worst!r}"
            )
        return (
            f"{head}: max|diff| {self.max_abs_diff:.3g}, "
            f"max ULP {self.max_ulp:g}, {self.mismatches}/{self.numel} differ{where}"
            + (f" ({self.note})" if self.note else "")
        )


@dataclass(frozen=True)
class CaseResult(Record):
    """One case of one gate, stored once, with its verdict and every comparison it made.

    ``case`` says what differs from the defaults (``harness.cases.Case.describe``);
    ``status`` is the verdict of what the run judged against (``--against``); each
    comparison says what it was made against, so both verdicts can be shown (``verdict``);
    ``figures`` holds what a gate measured besides comparisons (singular-value band,
    orthogonality error); ``tier`` names the tier of a verdict the gate reached itself."""

    kind: ClassVar[str] = "case"
    id: int
    gate: str
    case: str
    status: Status = "passed"
    message: str = ""
    seconds: float = 0.0
    reproduce: str = ""
    tier: str = ""
    figures: Mapping[str, float] = field(default_factory=dict)
    comparisons: tuple[Comparison, ...] = ()
    #: whose code the case judged: the candidate (``module:name``), or a part of muongate
    judged: str = ""
    #: what was changed to fit the candidate's declarations (``Impl.adapt``)
    narrowed: tuple[str, ...] = ()
    #: the case's layout family (``harness.cases.Case.layout``: fsdp, 3-D, hsdp, tp, …)
    layout: str = ""
    #: what the verdict rests on: the ``reference``, or the candidate on one device (``self``); the
    #: other is shown beside it (``Comparison.against``); empty in streams before it was written
    against: str = ""

    @property
    def passed(self) -> bool:
        """Green: bitwise or in its tier, or within the candidate's declared causes."""
        return self.status in GREEN

    @property
    def failed(self) -> bool:
        """Red: it differed beyond what explains it, or crashed (a case not judged is neither)."""
        return self.status not in NOT_FAILED

    @property
    def finding(self) -> str:
        """What kind of failure this is (``finding_of``): ``beyond its causes`` where the runner
        found a difference far past what the candidate's declared causes explain (``figures``)."""
        if self.status == "failed" and self.figures.get(BEYOND_CAUSES):
            return "beyond its causes"
        return finding_of(self.status, self.comparisons, self.against or "self")

    def verdict(self, against: str) -> bool | None:
        """Whether every comparison with ``against`` passed; ``None`` where there was none."""
        return verdict_of(self.comparisons, against)

    def fields_json(self) -> dict[str, Any]:
        return {name: _table(value) if name == "comparisons" else _plain(value) for name, value in self.changed()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CaseResult:
        comparisons = _untable(data.get("comparisons", ()))
        plain = super().from_json({k: v for k, v in data.items() if k not in ("comparisons", "figures")})
        return dataclasses.replace(plain, comparisons=comparisons, figures=dict(data.get("figures", {})))


def _table(comparisons: Iterable[Comparison]) -> dict[str, list[Any]]:
    """A case's comparisons as ``{"rows": [...], "at": [...]}`` (see the module docstring)."""
    rows: list[list[Any]] = []
    index: dict[str, int] = {}
    at: list[Any] = []
    for c in comparisons:
        row = c.to_row()
        # Keyed by its JSON text, so rows that differ in any figure's bits (-0.0 and 0.0) stay two.
        i = index.setdefault(_text(row), len(rows))
        if i == len(rows):
            rows.append(row)
        where = [i, c.step, c.rank]
        while len(where) > 1 and where[-1] == 0:
            where.pop()
        at.append(where if len(where) > 1 else i)
    return {"rows": rows, "at": at}


def _untable(data: Any) -> tuple[Comparison, ...]:
    """A case's comparisons from its table, or from schema 2's list of one object each."""
    if not isinstance(data, Mapping):
        return tuple(Comparison.from_json(c) for c in data)
    rows = data.get("rows", [])
    comparisons = []
    for where in data.get("at", []):
        i, step, rank = [*where, 0, 0][:3] if isinstance(where, list) else (where, 0, 0)
        comparisons.append(Comparison.from_row(rows[i], step, rank))
    return tuple(comparisons)


def verdict_of(comparisons: Iterable[Comparison], against: str) -> bool | None:
    """Whether every comparison with ``against`` passed; ``None`` where there was none."""
    mine = [c.passed for c in comparisons if c.against == against]
    return all(mine) if mine else None


#: a case's figure: how many of its tensors lie far past what the candidate's declared causes
#: explain (``harness.verdicts.causes.beyond_causes``); such a case is a finding of its own kind
BEYOND_CAUSES = "beyond_causes"
#: a case's figure: the largest fraction of its setting's cause tier that a tensor of a case
#: ``within causes`` reached (``harness.verdicts.causes.CauseVerdict.reach``)
CAUSE_REACH = "cause_reach"


def finding_of(status: Status, comparisons: Iterable[Comparison], against: str = "self") -> str:
    """What kind of failure a case is: a crash's status, or which comparisons differed (those
    with what the case was judged ``against`` first: an engine's own optimizer shown beside the
    reference is not what failed it), else ``failed`` (a verdict the gate reached itself, or a
    case that compared nothing)."""
    if status != "failed":
        return status
    comparisons = tuple(comparisons)
    for side in (against, "reference" if against == "self" else "self"):
        if verdict_of(comparisons, side) is False:
            return "differs from itself" if side == "self" else "differs from reference"
    return "failed"


@dataclass(frozen=True)
class Skip(Record):
    """A gate that did not run, and why."""

    kind: ClassVar[str] = "skip"
    gate: str
    reason: str


@dataclass(frozen=True)
class Scenario(Record):
    """What one MoE empty-expert scenario did (``harness.verdicts.outcomes.classify``)."""

    kind: ClassVar[str] = "scenario"
    gate: str
    scenario: str
    wrapping: str
    variant: str
    outcome: str
    case: str = ""
    detail: str = ""
    no_tokens: tuple[tuple[int, int], ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    collectives: tuple[Mapping[str, Any], ...] = ()
    seconds: float = 0.0

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Scenario:
        plain = super().from_json({k: v for k, v in data.items() if k not in ("env", "collectives")})
        return dataclasses.replace(
            plain, env=dict(data.get("env", {})), collectives=tuple(dict(c) for c in data.get("collectives", ()))
        )


@dataclass(frozen=True)
class Training(Record):
    """A loss curve: mean per-rank training loss at each step and held-out figures, in bits per byte."""

    kind: ClassVar[str] = "training"
    gate: str
    case: str
    world_size: int = 0
    train_bits: tuple[float, ...] = ()
    held_out_bits: tuple[float | None, ...] = ()
    seconds: float = 0.0


@dataclass(frozen=True)
class Spectrum(Record):
    """Singular values of one orthogonalized matrix, and the band they were held to."""

    kind: ClassVar[str] = "spectrum"
    gate: str
    shape: tuple[int, ...]
    dtype: str
    singular_values: tuple[float, ...]
    band: tuple[float, float]


@dataclass(frozen=True)
class NegativeControl(Record):
    """A known-wrong variant, whether the gates caught it, and the minimal case that showed it."""

    kind: ClassVar[str] = "negative_control"
    gate: str
    detected: bool
    case: str
    message: str = ""


@dataclass(frozen=True)
class Routing(Record):
    """Which algorithm stepped each parameter of one case (the routing audit): per parameter,
    its name and shape, the algorithm declared for it, the one its state showed (by rank where
    the ranks differ), and the verdict, ``ok``, ``wrong`` or ``not shown``; ``case``: its world,
    layout and steps."""

    kind: ClassVar[str] = "routing"
    gate: str
    case: str
    judged: str = ""
    rows: tuple[tuple[str, str, str, str], ...] = ()


@dataclass(frozen=True)
class Unjudged(Record):
    """A part of what the session was given that no gate judged, and why: a captured parameter
    or mesh the replay could not lay out (``harness.replay``), a layout the candidate declares
    that this ``--nproc`` cannot draw. ``asked``: the user named it (a capture's parameter is
    named by ``--layout-from``), so leaving it unjudged fails the session unless
    ``--allow-unjudged``; otherwise it is shown, and fails nothing."""

    kind: ClassVar[str] = "unjudged"
    #: what was left: ``parameter layers.0.wq.weight``, ``mesh [2, 2]``, ``layout hsdp``
    part: str
    reason: str
    asked: bool = True


@dataclass(frozen=True)
class Accepted(Record):
    """A gate whose failing cases the user accepted as a known finding (``--accept FILE``,
    ``harness.plugin.accepted``): shown as accepted, naming the finding, never as bitwise."""

    kind: ClassVar[str] = "accepted"
    gate: str
    finding: str
    reason: str
    #: the file that accepted it
    source: str = ""


KINDS: dict[str, type[Record]] = {
    cls.kind: cls
    for cls in (Header, CaseResult, Skip, Scenario, Training, Spectrum, NegativeControl, Routing, Unjudged, Accepted)
}


class SchemaError(ValueError):
    """A stream this reader cannot read (a newer schema, or not a muongate stream)."""


def decode(lines: Iterable[Mapping[str, Any]], *, source: str = "stream") -> Iterator[Record]:
    """Records from a stream's JSON objects, first line the header; schema 1 is upgraded."""
    it = iter(lines)
    first = next(it, None)
    if first is None:
        return
    if first.get("kind") != "header":
        raise SchemaError(f"{source}: the first record is {first.get('kind')!r}, not a muongate header")
    schema = first.get("schema", 1)
    if schema == 1:
        yield from upgrade_v1([first, *it])
        return
    if schema not in READS:
        raise SchemaError(
            f"{source}: schema {schema}, written by another muongate; this one reads schemas 1 to {SCHEMA}"
        )
    yield Header.from_json(first)
    for data in it:
        cls = KINDS.get(str(data.get("kind")))
        if cls is not None:
            yield cls.from_json(data)


def upgrade_v1(lines: Iterable[Mapping[str, Any]]) -> Iterator[Record]:
    """Schema 1: every comparison carried its gate and the case text, and preceded its case record."""
    pending: dict[str, list[Comparison]] = {}
    ids = 0
    for data in lines:
        kind = data.get("kind")
        if kind == "header":
            yield Header.from_json({**data, "schema": 1, "devices": data.get("devices", ())})
        elif kind == "comparison":
            pending.setdefault(data["gate"], []).append(Comparison.from_json(data))
        elif kind == "case":
            ids += 1
            figures = {k: float(data[k]) for k in ("sv_min", "sv_max", "orthogonality_error") if k in data}
            failure = _v1_status(data)
            yield CaseResult(
                id=ids,
                gate=data["gate"],
                case=data.get("case", ""),
                status=failure,
                message=data.get("message", ""),
                seconds=float(data.get("seconds", 0.0)),
                reproduce=data.get("reproduce", "") if failure != "passed" else "",
                tier=data.get("tier", ""),
                figures=figures,
                comparisons=tuple(pending.pop(data["gate"], ())),
            )
        elif kind in KINDS:
            yield KINDS[kind].from_json(data)


def _v1_status(data: Mapping[str, Any]) -> Status:
    if data.get("passed"):
        return "passed"
    message = str(data.get("message", ""))
    head = message.split(":", 1)[0]
    if " died" in head:
        return "abort"
    if " hang" in head:
        return "hang"
    return "error" if " error" in head else "failed"


def dumps(record: Record) -> str:
    """One stream line (compact: a CI run holds tens of thousands of comparisons)."""
    return _text(record.to_json())


def _text(value: Any) -> str:
    # Floats as Python's repr writes them: the shortest text that reads back to the same bits.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
