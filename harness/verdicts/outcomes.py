"""What a run that may hang, abort or corrupt did, named from the pool's outcome and the comparisons.

The classes: a **hang** (a rank still running at the deadline, or a collective library's
timeout), an **abort** (a rank killed by a signal), a **collective mismatch** (what
``TORCH_DISTRIBUTED_DEBUG=DETAIL`` reports, with each rank's operation, sequence number
and shape), **silent corruption** (every rank finished, some comparison is off the
reference), **refused** (an optimizer refused the run's gradients with an error naming the
parameter), **completed**, and any other **error**.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from harness.ranks import CaseOutcome
from harness.ranks.stacks import crash_cause
from reports.records import Comparison

Outcome = Literal["hang", "abort", "collective mismatch", "silent corruption", "refused", "completed", "error"]

#: The MoE reproductions' deadline: a case not finished after this long is a hang. Longer than
#: an MoE case needs on a fresh pool (CUDA and NCCL start-up included). The pool calls most
#: hangs long before, from the ranks' stacks; this is the backstop where a stack does not
#: show the wait (NCCL's collectives are asynchronous).
HANG_DEADLINE_S = 8.0

_FINGERPRINT = re.compile(
    r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=(\d+),? ?OpType=(\w+)"
    r"(?:, TensorShape=\[([^\]]*)\])?"
)


@dataclass(frozen=True)
class Classified:
    """A scenario's outcome class, what showed it, and per-rank collectives where known."""

    outcome: Outcome
    detail: str
    seconds: float
    collectives: tuple[dict[str, Any], ...] = ()


def classify(outcome: CaseOutcome, records: Sequence[Comparison]) -> Classified:
    """Names what a run did, from the pool's outcome and the comparison records.

    A deadline or a library timeout is a hang; a rank killed by a signal is an abort; the
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` wrapper's error is a collective mismatch (with each
    rank's operation, sequence number and shape); a run that finished with any comparison
    off the reference is silent corruption; an error that names a parameter and says its
    gradient is on some ranks only (``ShardedMuon``'s agreement check) is a refusal.
    """
    failure, secs = outcome.failure, outcome.seconds
    if failure is None:
        bad = [r for r in records if not r.passed]
        if not bad:
            return Classified("completed", f"{len(records)} comparisons, all equal to the reference", secs)
        # a NaN difference is the worst there is: ``max`` alone keeps or drops it by its place
        worst = max(bad, key=lambda r: (math.isnan(r.max_abs_diff), r.max_abs_diff))
        return Classified(
            "silent corruption",
            f"every rank exited cleanly; {len(bad)} of {len(records)} comparisons differ from the reference, "
            f"worst {worst.tensor} step {worst.step} rank {worst.rank}: max|diff| {worst.max_abs_diff:.3g}",
            secs,
        )
    if failure.kind == "hang":
        return Classified("hang", f"{failure.message} ({secs:.1f} s); {_where(failure.stacks)}", secs)
    if failure.kind == "died" and "Watchdog caught collective operation timeout" in failure.message:
        return Classified("hang", f"rank {failure.rank}: NCCL's watchdog: {_reason(failure.message)}", secs)
    if failure.kind == "died":
        return Classified(
            "abort", f"rank {failure.rank} exit code {failure.exitcode}: {_reason(failure.message)}", secs
        )
    # Each rank's own error names its own collective first; what it says of its peer is
    # the wrapper's second-hand (and garbled) view, so only the first is kept.
    collectives = []
    for rank, text in [(failure.rank, failure.message), *failure.stacks.items()]:
        own = [m for m in _FINGERPRINT.findall(text) if int(m[0]) == rank][:1]
        collectives += [{"rank": rank, "sequence": int(seq), "op": op, "shape": shape} for _, seq, op, shape in own]
    if "Detected mismatch between collectives" in failure.message:
        named = "; ".join(f"rank {c['rank']}: #{c['sequence']} {c['op']} [{c['shape']}]" for c in collectives)
        return Classified("collective mismatch", named or _reason(failure.message), secs, tuple(collectives))
    if "Timed out" in failure.message or "timeout" in failure.message.lower():
        return Classified("hang", f"rank {failure.rank}: {_reason(failure.message)}", secs)
    refusal = _REFUSAL.search(failure.message)
    if refusal:
        return Classified("refused", f"rank {failure.rank}: {refusal.group(0)}", secs)
    return Classified("error", f"rank {failure.rank}: {_reason(failure.message)}", secs)


_REFUSAL = re.compile(
    r"ValueError: parameter '[^']+' \(shape [^)]*\)[^\n]* has a gradient on \d+ of the \d+ ranks[^\n]*"
)


def _reason(text: str) -> str:
    """The line of a log or traceback that says why (the collective library's words). In a
    killed rank's log, that comes before Python's fatal-signal report, whose first line
    ("Fatal Python error: Aborted") and last (the extension modules loaded) say only that it died."""
    cause = crash_cause(text)
    if cause is not None:
        return cause[:300]
    keys = ("Error", "error", "doesn't match", "mismatch", "Aborted", "timeout", "Timed out")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("Extension modules:")]
    for ln in lines:
        if any(k in ln for k in keys) and not ln.startswith("File "):
            return ln[:300]
    return lines[-1][:300] if lines else "no output"


def _where(stacks: Mapping[int, str]) -> str:
    """The innermost torch.distributed call each hung rank is in."""
    parts = []
    for rank, text in sorted(stacks.items()):
        frames = re.findall(r'File "[^"]*/torch/distributed/([^"]+)", line \d+ in (\w+)', text)
        parts.append(f"rank {rank} in {frames[0][1] if frames else 'unknown'}")
    return ", ".join(parts)
