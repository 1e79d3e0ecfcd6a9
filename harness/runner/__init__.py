"""What a gate calls: run a case on the ranks, write what happened, pass or fail with the verdict.

One module per job, put together by ``GateRunner`` (``gate``), the one object gates hold:

``adapt``
    a drawn case made into the case that runs for the session's candidate, kernel and ``--against``;
``dispatch``
    rank tasks by name, run on the pool or on ``torchrun``'s ranks;
``ran``
    what a case that ran is (``Ran``) and its verdict; the protocol every case kind meets (``RankCase``);
``record``
    the only writer of the results stream (``reports.records`` holds every kind it writes);
``policy``
    which tests skip for the session's candidate, naming why;
``findings``
    how a gate fails (one exception type per kind of finding), and crashes already shrunk;
``controls``
    the negative-control search; ``scenarios``: training, and the MoE reproductions.

Gates state claims: they choose cases, and where a gate reaches a verdict itself (a
singular-value band, finiteness) it hands the verdict to ``GateRunner.judge``. A failure is
reported as its verdict (figures, each failing rank's exit code and stack, the case, the
command that reproduces it), never as a traceback through the harness.
"""

from harness.runner.dispatch import RANK_PRELOAD
from harness.runner.findings import FINDINGS, AlreadyShrunk, Finding, fail
from harness.runner.gate import GateRunner
from harness.runner.ran import Ran, RankCase, robust_finding

__all__ = [
    "FINDINGS",
    "RANK_PRELOAD",
    "AlreadyShrunk",
    "Finding",
    "GateRunner",
    "Ran",
    "RankCase",
    "fail",
    "robust_finding",
]
