"""The muongate pytest plugin: ``--nproc``, the ``gate`` marker, the rank pool, the report.

Loaded by the root ``conftest.py`` and exposed as the ``harness.plugin`` ``pytest11`` entry
point, so after ``pip install`` another project's suite has it too (and runs the gates
with ``--pyargs gates``).
Heavy imports (torch, rich) wait until they are needed.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from harness.cases import DEFAULT_CANDIDATE
from harness.launcher import LauncherGroup, launched_by_torchrun

# Profiles are registered at import, before hypothesis's own plugin reads
# --hypothesis-profile; "ci" is the default unless that option or the variable says otherwise.
# Distributed cases take milliseconds to seconds, so hypothesis's per-example deadline is off;
# the pool's own deadline bounds each case. "ci" is derandomized so CI runs are repeatable.
_BASE = settings(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], print_blob=True
)
settings.register_profile("ci", _BASE, max_examples=200, derandomize=True)
settings.register_profile("dev", _BASE, max_examples=20)
settings.register_profile("thorough", _BASE, max_examples=2000)
settings.load_profile(os.environ.get("MUONGATE_HYPOTHESIS_PROFILE", "ci"))

DEFAULT_REPORT_DIR = "gate-report"
_NPROC = pytest.StashKey[int]()
_RUNNER = pytest.StashKey[Any]()
_SKIPS = pytest.StashKey[list[dict[str, Any]]]()
_IMPL = pytest.StashKey[Any]()
_KERNEL = pytest.StashKey[Any]()
_BASELINE = pytest.StashKey[Any]()
_BASELINE_DIFF = pytest.StashKey[Any]()
_DEVICES = pytest.StashKey[tuple[str, list[str]]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("muongate", "muongate: distributed optimizer equivalence gates")
    group.addoption(
        "--nproc",
        type=int,
        default=None,
        help="number of rank processes in the pool (default: 2). Cases draw world sizes from 1 to this.",
    )
    group.addoption(
        "--gate-device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where ranks run: cpu (gloo), cuda (NCCL, one GPU per rank), or auto: cuda when "
        "at least --nproc GPUs are visible, else cpu (default: auto).",
    )
    group.addoption(
        "--case-timeout",
        type=float,
        default=120.0,
        help="wall-clock seconds one distributed case may take before its ranks are dumped and killed (default: 120).",
    )
    group.addoption(
        "--impl",
        metavar="MODULE:FACTORY",
        default=None,
        help="put this optimizer factory in place of distributed_impl.ShardedMuon in every optimizer gate "
        "(the contract is in harness/plugins.py and the README).",
    )
    group.addoption(
        "--kernel",
        metavar="MODULE:FN",
        default=None,
        help="a Newton-Schulz kernel FN(matrix, steps) -> matrix: every optimizer gate runs it on both sides, "
        "and the kernel gates measure it against the reference (contract: harness/kernels.py, README).",
    )
    group.addoption(
        "--gate-baseline",
        metavar="FILE",
        default=None,
        help="a figures.json from an earlier run: the session fails if a gate that was bitwise no longer is, "
        "or its worst error or singular-value band got worse beyond the stated margins.",
    )
    group.addoption(
        "--gate-report",
        default=DEFAULT_REPORT_DIR,
        metavar="DIR",
        help=f"directory for results.jsonl, equivalence.html and equivalence.md (default: {DEFAULT_REPORT_DIR}).",
    )


def _resolve_device(config: pytest.Config, nproc: int) -> tuple[str, list[str]]:
    """The backend and one device per rank (under torchrun: this rank's device only)."""
    import torch

    wanted = config.getoption("gate_device")
    if launched_by_torchrun():
        local = int(os.environ["LOCAL_RANK"])
        if wanted != "cpu" and torch.cuda.device_count() > local:
            return "nccl", [f"cuda:{local}"]
        if wanted == "cuda":
            raise pytest.UsageError(f"--gate-device cuda: local rank {local} has no GPU of its own")
        return "gloo", ["cpu"]
    # Under pytest-xdist each worker runs its own pool on its own block of GPUs.
    workers, index = _xdist_workers(config)
    gpus = torch.cuda.device_count() if wanted != "cpu" else 0
    if wanted == "cuda" and gpus < nproc:
        raise pytest.UsageError(
            f"--gate-device cuda needs one GPU per rank: --nproc {nproc} but {gpus} GPU(s) are visible; "
            f"try --nproc {max(gpus, 1)} or --gate-device cpu"
        )
    if wanted == "cuda" or (wanted == "auto" and gpus >= nproc):
        if gpus < nproc * workers:
            raise pytest.UsageError(
                f"-n {workers} --nproc {nproc} needs {nproc * workers} GPUs (each xdist worker gets its own "
                f"{nproc}); {gpus} are visible: try -n {gpus // nproc} or --gate-device cpu"
            )
        return "nccl", [f"cuda:{index * nproc + r}" for r in range(nproc)]
    return "gloo", ["cpu"] * nproc


def _xdist_workers(config: pytest.Config) -> tuple[int, int]:
    """(number of xdist workers, this worker's index); (1, 0) without xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), int(worker.removeprefix("gw"))
    count = getattr(config.option, "numprocesses", None)
    return (count if isinstance(count, int) and count > 0 else 1), 0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gate: a distributed equivalence claim run on the rank pool")
    nproc = config.getoption("nproc")
    if launched_by_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if nproc is not None and nproc != world:
            raise pytest.UsageError(
                f"--nproc {nproc} under torchrun, whose world size is {world}: the launcher decides; drop --nproc"
            )
        nproc = world
        if int(os.environ["RANK"]) != 0:
            config.option.verbose = -2  # rank 0 speaks for the job; the others report only failures
    nproc = 2 if nproc is None else nproc
    if nproc < 1:
        raise pytest.UsageError(f"--nproc {nproc}: the pool needs at least one rank; try --nproc 2")
    config.stash[_NPROC] = nproc
    os.environ["MUONGATE_NPROC"] = str(nproc)
    # Resolved once, here: usage errors (too few GPUs) come now, not at the first gate.
    config.stash[_DEVICES] = _resolve_device(config, nproc)
    config.stash[_IMPL] = _impl(config)
    config.stash[_KERNEL] = _kernel(config)
    config.stash[_BASELINE] = _baseline(config)
    if _is_xdist_controller(config):
        # Workers stream to results-gwN.jsonl and the controller merges every such file in
        # the directory at the end, so an earlier run's must go first.
        for stale in Path(config.getoption("gate_report")).glob("results-gw*.jsonl"):
            stale.unlink()


def _is_xdist_controller(config: pytest.Config) -> bool:
    return _xdist_workers(config)[0] > 1 and not os.environ.get("PYTEST_XDIST_WORKER")


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    if launched_by_torchrun():
        # Every rank must draw the same examples in the same order: no randomness, no database.
        settings.register_profile("torchrun", settings.default, derandomize=True, database=None)
        settings.load_profile("torchrun")


def pytest_report_header(config: pytest.Config) -> str:
    import hypothesis
    import torch

    backend, devices = config.stash[_DEVICES]
    return (
        f"muongate: torch {torch.__version__}, backend {backend} on {devices[0].split(':')[0]}, "
        f"nproc {config.stash[_NPROC]}, hypothesis {hypothesis.__version__} profile {settings._current_profile}"
    )


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@pytest.fixture(scope="session")
def gate_runner(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The session's ``GateRunner``: a rank pool plus the results stream."""
    import torch

    from harness.pool import RankPool
    from harness.runner import GateRunner
    from reports.stream import ResultStream

    config = request.config
    nproc = config.stash[_NPROC]
    backend, devices = config.stash[_DEVICES]
    directory = config.getoption("gate_report")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    name = f"results-{worker}.jsonl" if worker else "results.jsonl"
    torchrun = launched_by_torchrun()
    writes_report = not torchrun or int(os.environ["RANK"]) == 0
    stream = ResultStream(os.path.join(directory, name) if writes_report else None)
    stream.write(
        {
            "kind": "header",
            "torch": torch.__version__,
            "backend": backend,
            "device": devices[0].split(":")[0],
            "devices": devices,
            "nproc": nproc,
            "hypothesis_profile": settings._current_profile,
            "hypothesis_seed": config.getoption("hypothesis_seed", None),
            "git_commit": _git_commit(),
            "impl": config.getoption("impl") or DEFAULT_CANDIDATE,
            "kernel": config.getoption("kernel"),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
        sync=True,
    )
    timeout = config.getoption("case_timeout")
    pool: Any
    if torchrun:
        pool = LauncherGroup(backend=backend, device=devices[0], timeout_s=timeout)
    else:
        pool = RankPool(nproc, backend=backend, devices=devices, case_timeout_s=timeout)
    tty = _terminal() if writes_report else None
    progress = _CaseProgress.start(tty) if tty is not None else None
    runner = GateRunner(
        pool, stream, launcher=torchrun, on_case=progress, impl=config.stash[_IMPL], kernel=config.stash[_KERNEL]
    )
    config.stash[_RUNNER] = runner
    _flush_skips(config)
    try:
        yield runner
    finally:
        if progress is not None:
            progress.stop()
        pool.shutdown()
        stream.close()


def _impl(config: pytest.Config) -> Any:
    from harness.plugins import Impl

    return _load_plugin(config, "impl", Impl.load, "MODULE:FACTORY")


def _kernel(config: pytest.Config) -> Any:
    from harness.kernels import Kernel

    if config.getoption("kernel") and config.getoption("impl"):
        raise pytest.UsageError("--kernel with --impl: a plug-in optimizer brings its own Newton-Schulz; use one")
    return _load_plugin(config, "kernel", Kernel.load, "MODULE:FN")


def _load_plugin(config: pytest.Config, option: str, load: Callable[[str], Any], form: str) -> Any:
    """``--option MODULE:NAME`` loaded by ``load``; any import or declaration error is a usage error."""
    spec = config.getoption(option)
    if spec is None:
        return None
    try:
        return load(spec)
    except (ImportError, AttributeError, TypeError, ValueError) as e:
        raise pytest.UsageError(f"--{option} {spec}: {e}; expected {form} importable from here") from e


def _baseline(config: pytest.Config) -> Any:
    """The ``--gate-baseline`` figures, read now so that a bad file is a usage error, not a late crash."""
    import json

    from reports.summary import from_figures

    path = config.getoption("gate_baseline")
    if path is None:
        return None
    try:
        return from_figures(json.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise pytest.UsageError(
            f"--gate-baseline {path}: {e}; expected the figures.json an earlier run wrote to its --gate-report directory"
        ) from e


def _terminal() -> Any:
    """The controlling terminal of a person watching (not CI), or ``None``.

    pytest captures file descriptors 1 and 2 while tests run, so a live display during a
    test must write to the terminal device itself.
    """
    if os.environ.get("CI"):
        return None
    try:
        return open("/dev/tty", "w")  # closed by _CaseProgress.stop
    except OSError:
        return None


class _CaseProgress:
    """A live count of cases per gate on the terminal, for long interactive runs; gone when done."""

    def __init__(self, tty: Any) -> None:
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TextColumn("{task.completed} cases, {task.fields[failed]} failed"),
            TimeElapsedColumn(),
            console=Console(file=tty, force_terminal=True),
            transient=True,
        )
        self._tty = tty
        self._tasks: dict[str, Any] = {}

    @classmethod
    def start(cls, tty: Any) -> _CaseProgress:
        progress = cls(tty)
        progress._progress.start()
        return progress

    def __call__(self, gate: str, passed: bool) -> None:
        if gate not in self._tasks:
            self._tasks[gate] = self._progress.add_task(gate, total=None, failed=0)
        task = self._tasks[gate]
        failed = self._progress.tasks[task].fields["failed"] + (not passed)
        self._progress.update(task, advance=1, failed=failed)

    def stop(self) -> None:
        self._progress.stop()
        self._tty.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A skipped gate goes into the stream with its reason, so the report shows what did not run."""
    report = yield
    if report.skipped and item.get_closest_marker("gate") is not None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        item.config.stash.setdefault(_SKIPS, []).append(
            {"kind": "skip", "gate": item.nodeid, "reason": reason.removeprefix("Skipped: ")}
        )
        _flush_skips(item.config)
    return report


def _flush_skips(config: pytest.Config) -> None:
    runner = config.stash.get(_RUNNER, None)
    if runner is not None:
        for record in config.stash.get(_SKIPS, []):
            runner.stream.write(record, sync=True)
        config.stash[_SKIPS] = []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    runner = item.config.stash.get(_RUNNER, None)
    if runner is not None:
        runner.nodeid = item.nodeid


def _streams(config: pytest.Config) -> list[Path]:
    """This session's result streams: its own, or (xdist controller) every worker's."""
    runner = config.stash.get(_RUNNER, None)
    if runner is not None and runner.stream.path is not None:
        return [runner.stream.path]
    if _is_xdist_controller(config):
        return sorted(Path(config.getoption("gate_report")).glob("results-gw*.jsonl"))
    return []


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With ``--gate-baseline``: a regression against the stored figures fails the session."""
    baseline = session.config.stash.get(_BASELINE, None)
    streams = _streams(session.config)
    if baseline is None or not streams:
        return
    from reports.compare import diff_runs
    from reports.stream import read_streams
    from reports.summary import summarize

    diff = diff_runs(baseline, summarize(read_streams(streams)))
    session.config.stash[_BASELINE_DIFF] = diff
    if diff.regressed and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    streams = _streams(config)
    if not streams:
        return
    from rich.console import Console

    from reports.compare import render_diff
    from reports.stream import read_streams
    from reports.summary import render, summarize, write_files

    records = read_streams(streams)
    summary = summarize(records)
    if not (summary.gates or summary.scenarios or summary.negative_controls):
        return
    console = Console(
        file=terminalreporter._tw._file, width=max(140, terminalreporter._tw.fullwidth), no_color="CI" in os.environ
    )
    console.print(render(summary))
    directory = streams[0].parent
    write_files(summary, str(directory), records)
    names = ", ".join(p.name for p in streams)
    terminalreporter.write_line(f"muongate report: {directory}/equivalence.html, equivalence.md, figures.json, {names}")
    diff = config.stash.get(_BASELINE_DIFF, None)
    if diff is not None:
        console.print(render_diff(diff))
        for line in diff.messages():
            terminalreporter.write_line(f"REGRESSION against {config.getoption('gate_baseline')}: {line}", red=True)
