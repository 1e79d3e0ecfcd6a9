"""Repeats one gate selection many times, several runs at once if asked, and counts what became of each run.

    python -m benchmarks.stress --runs 20 --jobs 4 [--for S] [--repo DIR] [--limit 600] [--out FILE] -- PYTEST ARGS…

Each run is ``python -m pytest PYTEST ARGS -p no:randomly -p no:cacheprovider --gate-report DIR``
from the checkout ``--repo`` (default: this one; give an older checkout to measure before a
change), with its own report directory. ``--for S`` starts no run after S seconds (the runs
under way finish), for a machine lent by the minute. A spurious failure of a correct optimizer is a
defect of the harness, not a flake, so nothing is retried: every run counts.

A run's outcome is ``passed`` (pytest exited 0), or the failure statuses its report holds (each case's whole message is kept)
(``abort (SIGSEGV)``, ``hang``, ``error``, ``failed`` …, one outcome per distinct status),
or, when pytest itself was killed by a signal or ran past ``--limit``, that. The table lists
each outcome with how many runs it hit, the median and worst wall-clock seconds, and the
first failing run's headlines; ``--out`` writes every run as JSON Lines, with the tail of a
failing run's output, so that nothing seen is lost.

Quote the machine, torch and the command with the figures: the rate of a rare fault is only
as good as the number of runs behind it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from reports.records import CaseResult
from reports.stream import read_stream

HERE = Path(__file__).resolve().parents[1]
_KILLED = re.compile(r"killed \(exit code -?\d+, (SIG[A-Z]+)\)")


@dataclass(frozen=True)
class Run:
    index: int
    seconds: float
    returncode: int
    outcomes: tuple[str, ...]
    headlines: tuple[str, ...]
    tail: str
    #: how many cases the run's report holds, by ``layout status`` (``fsdp_tp passed``, ``tp hang``)
    cases: dict[str, int] = field(default_factory=dict)


def _outcomes(returncode: int, report: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What one run became: its failure statuses (a rank's signal named) and their headlines."""
    if returncode < 0:
        return (f"pytest killed ({signal.Signals(-returncode).name})",), ()
    statuses: set[str] = set()
    headlines: list[str] = []
    stream = report / "results.jsonl"
    if stream.exists():
        for record in read_stream(stream):
            if isinstance(record, CaseResult) and not record.passed:
                killed = _KILLED.search(record.message)
                statuses.add(f"{record.status} ({killed[1]})" if killed else record.status)
                headlines.append(f"{record.gate}: {record.message[:6000]}" if record.message else record.gate)
    if returncode == 0:
        return ("passed",), ()
    return tuple(sorted(statuses)) or (f"pytest exit {returncode}",), tuple(headlines[:5])


def _cases(report: Path) -> dict[str, int]:
    """The run's cases by layout and status: a false hang is rare per case, so the number of
    cases behind a rate counts, and which layouts they exercised."""
    stream = report / "results.jsonl"
    if not stream.exists():
        return {}
    counted = Counter(f"{r.layout or '-'} {r.status}" for r in read_stream(stream) if isinstance(r, CaseResult))
    return dict(counted)


def run_once(index: int, repo: Path, args: list[str], limit: float, until: float) -> Run | None:
    if time.monotonic() > until:
        return None
    with tempfile.TemporaryDirectory(prefix="muongate-stress-") as scratch:
        report = Path(scratch) / "report"
        command = [sys.executable, "-m", "pytest", *args, "-p", "no:randomly", "-p", "no:cacheprovider"]
        command += [f"--gate-report={report}"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
        start = time.monotonic()
        try:
            done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            return Run(index, time.monotonic() - start, -1, (f"past --limit {limit:g} s",), (), out[-4000:])
        seconds = time.monotonic() - start
        outcomes, headlines = _outcomes(done.returncode, report)
        # A failure's own section (its verdict and message) and the end of the output.
        text = done.stdout + done.stderr
        failures = text[text.find("= FAILURES =") :][:6000] if "= FAILURES =" in text else ""
        tail = "" if outcomes == ("passed",) else failures + "\n…\n" + text[-3000:]
        return Run(index, seconds, done.returncode, outcomes, headlines, tail, _cases(report))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="how many runs in all (default: 10)")
    parser.add_argument("--jobs", type=int, default=1, help="how many runs at once (default: 1)")
    parser.add_argument("--repo", type=Path, default=HERE, help="the muongate checkout to run (default: this one)")
    parser.add_argument("--for", dest="seconds", type=float, default=None, help="start no run after this many seconds")
    parser.add_argument("--limit", type=float, default=900.0, help="seconds before a run is killed (default: 900)")
    parser.add_argument("--out", type=Path, default=None, help="write every run here as JSON Lines")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then the pytest arguments of one run")
    options = parser.parse_args(argv)
    args = options.pytest_args[1:] if options.pytest_args[:1] == ["--"] else options.pytest_args
    if options.runs < 1 or options.jobs < 1:
        parser.error(f"--runs {options.runs} and --jobs {options.jobs} must both be at least 1")
    if not args:
        parser.error("no pytest arguments: give them after --, e.g. -- gates -m gate --nproc 2")
    repo = options.repo.resolve()
    print(f"stress: {options.runs} runs, {options.jobs} at once, of pytest {' '.join(args)} in {repo}", flush=True)
    runs: list[Run] = []
    start = time.monotonic()
    with ThreadPoolExecutor(options.jobs) as pool:
        until = start + options.seconds if options.seconds is not None else float("inf")
        futures = [pool.submit(run_once, i, repo, args, options.limit, until) for i in range(options.runs)]
        for future in futures:
            run = future.result()
            if run is None:
                continue
            runs.append(run)
            print(f"run {run.index}: {', '.join(run.outcomes)} in {run.seconds:.1f} s", flush=True)
            if options.out is not None:
                with options.out.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(asdict(run)) + "\n")
    print(f"\n{len(runs)} runs in {time.monotonic() - start:.0f} s, {options.jobs} at once")
    counts = Counter(outcome for run in runs for outcome in run.outcomes)
    print(f"{'outcome':<40} {'runs':>5} {'median s':>9} {'max s':>7}")
    for outcome, n in counts.most_common():
        times = [r.seconds for r in runs if outcome in r.outcomes]
        print(f"{outcome:<40} {n:>5} {statistics.median(times):>9.1f} {max(times):>7.1f}")
    cases: Counter[str] = Counter()
    for run in runs:
        cases.update(run.cases)
    print(f"\n{sum(cases.values())} cases:", ", ".join(f"{n} {what}" for what, n in sorted(cases.items())))
    for run in runs:
        if run.outcomes != ("passed",):
            print(f"\nfirst failing run ({run.index}):", *(h.splitlines()[0][:300] for h in run.headlines), sep="\n  ")
            break
    failed = sum(1 for r in runs if r.outcomes != ("passed",))
    print(f"\n{len(runs) - failed} passed, {failed} failed")


if __name__ == "__main__":
    main()
