"""Every record a run produces, in one place: one frozen dataclass per kind.

A stream (``results.jsonl``) is one JSON object per line; its first line is a ``Header``
with the schema version. Each record has a ``kind`` and one serialisation pair,
``to_json`` / ``from_json``. A field at its declared default is left out of the JSON
(most comparisons are bitwise, and a bitwise comparison has no figures to speak of), and
``from_json`` puts it back.

Kinds:

``header``
    once per run: versions, backend, devices, world size, profile, candidate, commit.
``case``
    one case, stored once: its gate, what differs from the defaults, the verdict, and
    every ``Comparison`` it made (a tensor of one step on one rank).
``skip``, ``scenario``, ``training``, ``spectrum``, ``negative_control``
    a skipped gate and why; what an MoE scenario did; a loss curve; singular values of an
    orthogonalized matrix; a known-wrong variant and whether the gates caught it.

Schema 1 (muongate before the records had a home) repeated the case text on every
comparison; ``upgrade_v1`` reads it. A stream of a newer schema is refused by name.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar

SCHEMA = 2

TierKind = Literal["bitwise", "tolerance", "oracle", "edge"]
#: How a case ended. ``failed``: it ran and some comparison did not pass (or the gate's own
#: verdict failed); ``hang``: ranks sat in collectives that could not complete;
#: ``collective mismatch``: ranks disagreed about a collective and were caught at it;
#: ``abort``: a rank was killed by a signal; ``error``: a rank raised.
Status = Literal["passed", "failed", "hang", "collective mismatch", "abort", "error"]

R = TypeVar("R", bound="Record")


@dataclass(frozen=True)
class Record:
    """The serialisation every kind shares (``kind`` is a class constant)."""

    kind: ClassVar[str] = ""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.fields_json()}

    def fields_json(self) -> dict[str, Any]:
        """The fields that differ from their defaults, as JSON values (a nested record is written so)."""
        return {
            f.name: _plain(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if not _is_default(f, getattr(self, f.name))
        }

    @classmethod
    def from_json(cls: type[R], data: Mapping[str, Any]) -> R:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: _tuples(v) for k, v in data.items() if k in names})


def _is_default(f: dataclasses.Field[Any], value: Any) -> bool:
    if f.default is not dataclasses.MISSING:
        return bool(value == f.default)
    if f.default_factory is not dataclasses.MISSING:
        return bool(value == f.default_factory())
    return False


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
    nproc: int = 0
    hypothesis_profile: str = ""
    hypothesis_seed: str | None = None
    impl: str = ""
    kernel: str | None = None
    #: what the optimizer gates judged against: ``reference`` or ``self`` (``--against``)
    against: str = "reference"
    time: str = ""

    def fields_json(self) -> dict[str, Any]:
        return {"schema": self.schema, **super().fields_json()}  # readers dispatch on it: always written


@dataclass(frozen=True)
class Comparison(Record):
    """One tensor of one step on one rank: the figures and the verdict (``harness.compare``)."""

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

    @property
    def numel(self) -> int:
        n = 1
        for side in self.shape:
            n *= side
        return n

    @property
    def mismatch_fraction(self) -> float:
        return self.mismatches / self.numel if self.numel else 0.0

    def line(self) -> str:
        """The comparison in one line, as a failure message lists it."""
        where = ""
        if self.worst_index is not None:
            where = (
                f", worst at {list(self.worst_index)}: expected {self.expected_at_worst!r} got {self.actual_at_worst!r}"
            )
        return (
            f"{self.tensor} step {self.step} rank {self.rank} [{self.tier}]: max|diff| {self.max_abs_diff:.3g}, "
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

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def finding(self) -> str:
        """What kind of failure this is (``finding_of``)."""
        return finding_of(self.status, self.comparisons)

    def verdict(self, against: str) -> bool | None:
        """Whether every comparison with ``against`` passed; ``None`` where there was none."""
        return verdict_of(self.comparisons, against)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CaseResult:
        comparisons = tuple(Comparison.from_json(c) for c in data.get("comparisons", ()))
        plain = super().from_json({k: v for k, v in data.items() if k not in ("comparisons", "figures")})
        return dataclasses.replace(plain, comparisons=comparisons, figures=dict(data.get("figures", {})))


def verdict_of(comparisons: Iterable[Comparison], against: str) -> bool | None:
    """Whether every comparison with ``against`` passed; ``None`` where there was none."""
    mine = [c.passed for c in comparisons if c.against == against]
    return all(mine) if mine else None


def finding_of(status: Status, comparisons: Iterable[Comparison]) -> str:
    """What kind of failure a case is: a crash's status, or which comparisons differed
    (``differs from itself`` before ``differs from reference``), else ``failed`` (a verdict
    the gate reached itself, or a case that compared nothing)."""
    if status != "failed":
        return status
    comparisons = tuple(comparisons)
    if verdict_of(comparisons, "self") is False:
        return "differs from itself"
    if verdict_of(comparisons, "reference") is False:
        return "differs from reference"
    return "failed"


@dataclass(frozen=True)
class Skip(Record):
    """A gate that did not run, and why."""

    kind: ClassVar[str] = "skip"
    gate: str
    reason: str


@dataclass(frozen=True)
class Scenario(Record):
    """What one MoE empty-expert scenario did (``harness.outcomes.classify``)."""

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


KINDS: dict[str, type[Record]] = {
    cls.kind: cls for cls in (Header, CaseResult, Skip, Scenario, Training, Spectrum, NegativeControl)
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
    if schema != SCHEMA:
        raise SchemaError(
            f"{source}: schema {schema}, written by another muongate; this one reads schemas 1 and {SCHEMA}"
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
    return json.dumps(record.to_json(), separators=(",", ":"), ensure_ascii=False, default=str)
