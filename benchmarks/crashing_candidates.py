"""How long the gates take on candidates that crash, and what they call each failure.

    python -m benchmarks.crashing_candidates [--repo DIR] [--limit 600] [-k optimizer_gates] [--candidates …]

Runs ``pytest -m gate --nproc 2 -k SELECT --impl …`` once per crashing example candidate
(``examples/deadlock_muon.py``: ranks disagree about an all-reduce; ``examples/aborting_muon.py``:
all-reduces of different sizes, which gloo aborts on), from a scratch directory that holds
a copy of the candidate, against the muongate checkout ``--repo`` (default: this one; give
an older checkout to measure before a change). Prints each run's wall-clock seconds, the
pytest summary line, and how many failing cases the report calls a hang, a collective
mismatch, an abort, an error or a plain failure, and how long such a case took to be named
(median and most). A run past ``--limit`` seconds is killed
and reported as such.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from reports.records import CaseResult
from reports.stream import read_stream

HERE = Path(__file__).resolve().parents[1]
CANDIDATES = ("deadlock_muon", "aborting_muon")


def run(candidate: str, repo: Path, select: str, limit: float) -> None:
    with tempfile.TemporaryDirectory(prefix="muongate-crash-") as scratch:
        shutil.copy(HERE / "examples" / f"{candidate}.py", Path(scratch) / f"{candidate}.py")
        report = Path(scratch) / "report"
        command = [
            sys.executable, "-m", "pytest", str(repo / "gates"), "-m", "gate", "--nproc", "2", "-q",
            "-p", "no:randomly", "-p", "no:cacheprovider", "--rootdir", str(repo), "-k", select,
            "--impl", f"{candidate}:{candidate}", f"--gate-report={report}",
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([scratch, str(repo)]), "CI": "true"}
        start = time.monotonic()
        try:
            done = subprocess.run(command, cwd=scratch, env=env, capture_output=True, text=True, timeout=limit)
            seconds, output = time.monotonic() - start, done.stdout
        except subprocess.TimeoutExpired as e:
            seconds = time.monotonic() - start
            output = (e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or "") + "\nkilled at --limit"
        summary = re.findall(r"^=*\s*(\d+ (?:failed|passed).*?)\s*=*$", output, re.MULTILINE)
        stream = report / "results.jsonl"
        failing = (
            [r for r in read_stream(stream) if isinstance(r, CaseResult) and not r.passed] if stream.exists() else []
        )
        statuses = Counter(r.status for r in failing)
        called = ", ".join(f"{n} {status}" for status, n in statuses.most_common()) or "none"
        print(f"{candidate:15} {seconds:8.1f} s  {summary[-1] if summary else output.strip().splitlines()[-1]}")
        print(f"{'':15} failing cases: {called}")
        for status in statuses:
            took = sorted(r.seconds for r in failing if r.status == status)
            print(f"{'':15} a {status} case took {statistics.median(took):.2f} s (median), {took[-1]:.2f} s at most")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, default=HERE, help="the muongate checkout to run (default: this one)")
    parser.add_argument("--limit", type=float, default=600.0, help="seconds before a run is killed (default 600)")
    parser.add_argument("-k", dest="select", default="optimizer_gates", help="pytest -k expression")
    parser.add_argument("--candidates", nargs="+", choices=CANDIDATES, default=list(CANDIDATES))
    args = parser.parse_args()
    print(f"gates of {args.repo} (-k {args.select}), 2 ranks, one run per candidate")
    for candidate in args.candidates:
        run(candidate, args.repo.resolve(), args.select, args.limit)


if __name__ == "__main__":
    main()
