"""Where cases run: a persistent pool of rank processes, or the ranks ``torchrun`` started."""

from harness.ranks.context import CaseOutcome, FailureKind, RankContext, RankFailure
from harness.ranks.launcher import LauncherGroup, launched_by_torchrun
from harness.ranks.pool import RankPool

__all__ = [
    "CaseOutcome",
    "FailureKind",
    "LauncherGroup",
    "RankContext",
    "RankFailure",
    "RankPool",
    "launched_by_torchrun",
]
