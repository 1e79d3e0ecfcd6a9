"""How a gate fails: one exception type per kind of finding, and the memory of crashes already shrunk.

A failed gate is shown as its verdict alone, through ``pytest.fail(..., pytrace=False)``: a
traceback through the harness would say nothing about the candidate. Hypothesis tells
failures apart by their exception type, so a test that meets an arithmetic difference and a
crash reports both, each shrunk to its own minimal case, instead of only the first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NoReturn

import pytest


class AlreadyShrunk(BaseException):
    """A crash that another gate of this session has already shrunk. It ends the running test
    at once, failed, instead of shrinking the same crash again (every attempt costs a fresh
    pool). A ``BaseException`` so that hypothesis lets it through rather than shrinking it."""


class Finding(pytest.fail.Exception):  # type: ignore[misc,name-defined]
    """A failed gate, shown as its verdict alone (no traceback through the harness); one
    subclass per kind of finding (``FINDINGS``)."""

    def __init__(self, text: str) -> None:
        super().__init__(text, pytrace=False)


#: the kind of finding → its exception type: a case that differs from what it was judged
#: against (the reference, or the candidate itself on one device) or a crash, by status
FINDINGS: dict[str, type[Finding]] = {
    kind: type(name, (Finding,), {"__doc__": f"A gate's finding: {kind}."})
    for kind, name in (
        ("differs from reference", "DiffersFromReference"),
        ("beyond its causes", "BeyondItsCauses"),
        ("differs from itself", "DiffersFromItself"),
        ("failed", "VerdictFailed"),
        ("hang", "Hang"),
        ("collective mismatch", "CollectiveMismatch"),
        ("abort", "Abort"),
        ("error", "RankError"),
    )
}


def fail(text: str, kind: str = "failed") -> NoReturn:
    """Fails the running test with ``text`` alone, as a finding of ``kind`` (``FINDINGS``)."""
    __tracebackhide__ = True
    raise FINDINGS[kind](text)


#: where a crash was shrunk: (gate, minimal case, node id)
Shrunk = tuple[str, str, str]


@dataclass
class ShrinkMemory:
    """Which crash (by signature) each test last met, and which crashes a test has shrunk.

    Hypothesis replays a test's minimal case last, so the crash a failed test met last is the
    one it shrank; a later test that meets the same crash is stopped at once (``AlreadyShrunk``)."""

    #: crash signature → where it was shrunk
    shrunk: dict[str, Shrunk] = field(default_factory=dict)
    _last: dict[str, tuple[str, Shrunk]] = field(default_factory=dict)

    def met(self, nodeid: str, signature: str, gate: str, described: str) -> Shrunk | None:
        """The running test met a crash: where another test already shrank it, if one did."""
        self._last[nodeid] = (signature, (gate, described, nodeid))
        earlier = self.shrunk.get(signature)
        return earlier if earlier is not None and earlier[2] != nodeid else None

    def finished(self, nodeid: str, failed: bool) -> None:
        """A test ended: the crash its minimal case showed counts as shrunk for the rest of the session."""
        last = self._last.pop(nodeid, None)
        if failed and last is not None:
            self.shrunk.setdefault(last[0], last[1])
