"""Accepted findings (``--accept FILE``): a known finding a user lives with, kept out of their CI's
red without calling it green.

A declared difference either lands within a calibrated tier (green, "within causes") or is a
finding: a gate that differs. A user who runs a package with a documented finding (DeepSpeed's
bf16 momentum at ZeRO 1–3, say) accepts it for their own CI, as pytest users accept a known
failure with ``xfail``: the file names each finding, the gates it covers (``fnmatch`` patterns of
the gate names the report shows), why, and the release it holds for. A gate test whose every
failing gate is covered by an accepted finding that applies is reported by pytest as ``xfailed``
(the session stays green on exactly those cells), and the report shows the gate as **accepted**,
naming the finding, never as bitwise. Anything else red stays red; a finding whose release is not
the one installed is not applied, and the terminal says so, so that a file written for one
release is red on another's new cells. The file is TOML::

    [[accepted]]
    finding = "deepspeed-bf16-momentum"
    gates = ["engine:stage [123] muon * bfloat16"]
    reason = "Muon's momentum is kept in bf16 at ZeRO 1-3 (matrix finding 28)"
    applies_to = "deepspeed==0.19.8"      # optional: the package and release it holds for

A bad file is refused at once, in one line naming the file, the entry and the field.
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

#: the fields of an ``[[accepted]]`` entry, and whether each is required
FIELDS: dict[str, bool] = {"finding": True, "gates": True, "reason": True, "applies_to": False}


@dataclass(frozen=True)
class AcceptedFinding:
    """One entry of the file: the finding, the gate names it covers, why, and the release it holds for."""

    finding: str
    gates: tuple[str, ...]
    reason: str
    applies_to: str = ""

    def covers(self, gate: str) -> bool:
        return any(fnmatch.fnmatchcase(gate, pattern) for pattern in self.gates)

    def installed(self) -> str | None:
        """Why the finding does not apply here (another release installed, or none), or ``None``."""
        if not self.applies_to:
            return None
        package, _, release = self.applies_to.partition("==")
        try:
            found = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return f"it applies to {self.applies_to}, and {package} is not installed"
        return None if found == release else f"it applies to {self.applies_to}, and {package} {found} is installed"


class AcceptedError(ValueError):
    """A file of accepted findings that cannot be read; its message is one line naming where."""


def load_accepted(path: str | Path) -> tuple[AcceptedFinding, ...]:
    """Reads and checks ``path`` (the module docstring's format)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise AcceptedError(f"{path}: cannot be read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise AcceptedError(f"{path}: not TOML ({e})") from None
    entries = data.get("accepted")
    unknown = sorted(set(data) - {"accepted"})
    if unknown or not isinstance(entries, list) or not entries:
        raise AcceptedError(f"{path}: holds [[accepted]] entries only, at least one (found {sorted(data)})")
    return tuple(_entry(path, i, e) for i, e in enumerate(entries))


def _entry(path: Path, i: int, entry: Any) -> AcceptedFinding:
    where = f"{path}: accepted[{i}]"
    if not isinstance(entry, Mapping):
        raise AcceptedError(f"{where}: is not a table")
    unknown = sorted(set(entry) - set(FIELDS))
    if unknown:
        raise AcceptedError(f"{where}: unknown field(s) {unknown}; the fields are {', '.join(FIELDS)}")
    for name, required in FIELDS.items():
        if required and name not in entry:
            raise AcceptedError(f"{where}: lacks {name!r}")
    gates = entry["gates"]
    if isinstance(gates, str):
        gates = [gates]
    if not (isinstance(gates, list) and gates and all(isinstance(g, str) and g for g in gates)):
        raise AcceptedError(f"{where}: 'gates' is a list of gate names or patterns, e.g. gates = ['engine:stage 1 *']")
    for name in ("finding", "reason", "applies_to"):
        if name in entry and not (isinstance(entry[name], str) and entry[name].strip()):
            raise AcceptedError(f"{where}: {name!r} is a string that says something")
    applies_to = entry.get("applies_to", "")
    if applies_to and applies_to.count("==") != 1:
        raise AcceptedError(f"{where}: applies_to={applies_to!r} is PACKAGE==RELEASE, e.g. 'deepspeed==0.19.8'")
    return AcceptedFinding(entry["finding"], tuple(gates), entry["reason"], applies_to)


class AcceptedFindings:
    """The plug-in ``--accept`` registers: turns a gate test whose failing gates are all accepted
    into an ``xfailed`` one and writes what it accepted into the results stream."""

    def __init__(self, path: str, accepted: tuple[AcceptedFinding, ...], runner: Callable[[], Any]) -> None:
        self.path = path
        why_not = [(a, a.installed()) for a in accepted]  # each release looked up once
        self.active = tuple(a for a, why in why_not if why is None)
        #: the entries that do not apply here, each with why
        self.inactive = tuple((a, why) for a, why in why_not if why is not None)
        self._runner = runner

    @pytest.hookimpl(wrapper=True, tryfirst=True)  # outermost: after the gate session has judged the report
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        report = yield
        runner = self._runner()
        if call.when != "call" or not report.failed or runner is None:
            return report
        failing = [gate for gate, g in runner.figures.get(item.nodeid, {}).items() if g.failed_cases]
        covering = {gate: next((a for a in self.active if a.covers(gate)), None) for gate in failing}
        if not failing or None in covering.values():
            return report
        from reports.records import Accepted

        for gate, finding in covering.items():
            assert finding is not None
            runner.write(Accepted(gate, finding.finding, finding.reason, self.path))
        names = sorted({f.finding for f in covering.values() if f is not None})
        report.outcome = "skipped"
        report.wasxfail = f"accepted ({self.path}): {', '.join(names)}"
        return report

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for finding, why in self.inactive:
            terminalreporter.write_line(
                f"muongate: accepted finding {finding.finding!r} of {self.path} not applied: {why}", yellow=True
            )
