"""One session of gates: the object the plug-in registers with pytest for each session
(``harness.plugin.pytest_configure``), which holds what the session resolved and runs and
answers its pytest hooks. Each job beside that is a room of its own: the hypothesis profile
(``harness.plugin.profiles``), where the ranks run (``harness.plugin.devices``), the plug-ins
and the family judged against (``harness.plugin.resolve``, whose family rule is
``harness.algorithms.judged_family``), and the exit status and report at the end
(``harness.plugin.verdict``, a plug-in this object makes and the plug-in registers beside it).
Nothing of it lives at module level, so that a session pytester starts inside another has an
object of its own.

Torch, the profile, the devices and the plug-ins wait for the first sign that the session runs
gates: an option only gates use (``--nproc``, ``--impl``…) or arguments that name muongate's
``gates`` package (at configure, so usage errors come before collection, as in any pytest
plugin), a file of that package about to be imported (``pytest_collect_file``), or a collected
test marked ``gate`` or asking for ``gate_runner`` (``pytest_collection_modifyitems``, still
before any rank starts).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from harness.plugin import profiles
from harness.plugin.devices import is_xdist_controller, launched_by_torchrun, xdist_worker
from harness.plugin.resolve import Resolved, resolve
from harness.plugin.verdict import Verdict


@dataclass(frozen=True)
class GateConfig:
    """The running session's configuration, as the plug-in resolved it (``GateSession.gate_config``)."""

    #: ranks in the pool (``--nproc``, or torchrun's world size)
    nproc: int = 2
    #: the family the session's candidate is judged against (``harness.algorithms.Algorithm``:
    #: ``--reference``, the one ``--impl`` declares, or ``harness.algorithms.DEFAULT_REFERENCE``),
    #: resolved at the end of collection, before any test runs (``None`` only until then)
    algorithm: Any = field(default=None)
    #: the sizes at which the candidate changes behaviour (``Candidate.thresholds``): drawn on both sides
    thresholds: tuple[int, ...] = ()
    #: the ``--engine`` the engine gates judge (``harness.engines.LoadedEngine``; ``None``: muongate's flat engine)
    engine: Any = None
    #: the capture ``--layout-from`` replays (``harness.replay.Replay``; ``None``: none)
    replay: Any = None
    #: what the ranks compute on: ``"cpu"`` or ``"cuda"`` (``--gate-device``), once resolved
    device: str = "cpu"


# muongate's own gates: the package beside ``harness``, in a checkout and in site-packages alike.
GATES = Path(__file__).resolve().parents[2] / "gates"


class GateSession:
    """What one pytest session of gates holds, and its hooks (module docstring)."""

    def __init__(self, config: pytest.Config, nproc: int) -> None:
        self.config = config
        #: ranks in the pool (``--nproc``, or torchrun's world size)
        self.nproc = nproc
        #: whether the session was seen to run gates (the profile is chosen then, once)
        self.gates_seen = False
        #: the devices and plug-ins, once resolved (on the first sign of gates; ``resolve``)
        self.parts: Resolved | None = None
        #: the runner, from the ``gate_runner`` fixture's start until the session ends
        self.runner: Any = None
        #: the pytest session, from its finish: under torchrun its exit status is the rank's
        self.session: pytest.Session | None = None
        #: gates skipped before the runner started, handed to it once it has
        self.skips: list[tuple[str, str]] = []
        self.header_shown = False
        #: an earlier run's report files this session removed (``None``: not cleared yet)
        self.cleared: list[str] | None = None
        #: the exit status and the report, a plug-in of its own, registered with this
        self.verdict = Verdict(config, self._streams, lambda: self.cleared or [], lambda: self.skips)
        if is_xdist_controller(config):
            # Workers stream to results-gwN.jsonl and the controller merges every such file in
            # the directory at the end, so an earlier run's must go first, with its report.
            self.clear_report()
        if _says_it_runs_gates(config):
            self.resolve()

    # -- what the gate modules read (``harness.session``) -----------------------------------------
    @property
    def gate_config(self) -> GateConfig:
        """The pool's size and, once resolved, the reference, the candidate's thresholds, the engine
        and the replay. Imports nothing a session without a candidate has not imported: a session
        that runs no gates (this repository's tests) reads it too, and pytester's inner sessions
        take away what they imported, torch included, which must not be imported twice."""
        parts = self.parts
        if parts is None:
            return GateConfig(nproc=self.nproc)
        return GateConfig(
            nproc=self.nproc,
            algorithm=parts.algorithm,
            thresholds=parts.thresholds,
            engine=parts.engine,
            replay=parts.replay,
            device=parts.device_kind,
        )

    # -- resolving the session, once ---------------------------------------------------------------
    def choose_profile(self) -> None:
        """The gates' hypothesis profile, once (``profiles.choose``)."""
        if not self.gates_seen:
            self.gates_seen = True
            profiles.choose(self.config)

    def resolve(self) -> Resolved:
        """The devices and the plug-ins, once (``harness.plugin.resolve``); any problem is a usage error."""
        if self.parts is None:
            self.parts = resolve(self.config, self.nproc)
        return self.parts

    # -- the runner ----------------------------------------------------------------------------------
    def start_runner(self) -> Iterator[Any]:
        """The session's ``GateRunner`` (the ``gate_runner`` fixture): a rank pool plus the results stream."""
        from harness.plugin.progress import CaseProgress, terminal
        from harness.ranks import LauncherGroup, RankPool
        from harness.reproduce import Rerun
        from harness.runinfo import make_header
        from harness.runner import RANK_PRELOAD, GateRunner
        from reports.stream import ResultStream

        config = self.config
        self.choose_profile()  # already done where collection saw the gate; not for a dynamic request
        parts = self.resolve()
        directory = config.getoption("gate_report")
        worker = xdist_worker(config)
        name = f"results-{worker}.jsonl" if worker else "results.jsonl"
        torchrun = launched_by_torchrun()
        writes_report = not torchrun or int(os.environ["RANK"]) == 0
        if writes_report and not worker:
            self.clear_report()
        stream = ResultStream(os.path.join(directory, name) if writes_report else None)
        timeout = config.getoption("case_timeout")
        pool: RankPool | LauncherGroup
        replay = parts.replay
        grids = replay.grids if replay is not None else ()
        if torchrun:
            pool = LauncherGroup(backend=parts.backend, device=parts.devices[0], timeout_s=timeout, grids=grids)
        else:
            threads = config.getoption("rank_threads")
            pool = RankPool(
                self.nproc,
                backend=parts.backend,
                devices=parts.devices,
                case_timeout_s=timeout,
                threads=threads,
                grids=grids,
                preload=RANK_PRELOAD,
            )
        tty = terminal() if writes_report else None
        progress = CaseProgress.start(tty) if tty is not None else None
        impl, kernel = parts.impl, parts.kernel
        against = config.getoption("against")
        seed = config.getoption("hypothesis_seed", None)
        rerun = Rerun(
            device=parts.device_kind,
            profile=settings.get_current_profile_name(),
            seed=None if seed is None else str(seed),
            model=config.getoption("model"),
            engine=config.getoption("engine"),
            reference=config.getoption("reference"),
            layout_from=str(replay.capture.path.resolve()) if replay is not None else None,
        )
        runner = GateRunner(
            pool, stream, launcher=torchrun, on_case=progress, impl=impl, kernel=kernel, against=against, rerun=rerun,
            algorithm=parts.algorithm,
        )  # fmt: skip
        runner.start(
            make_header(
                backend=parts.backend,
                devices=parts.devices,
                nproc=self.nproc,
                hypothesis_profile=settings.get_current_profile_name(),
                hypothesis_seed=None if seed is None else str(seed),
                impl=impl.spec if impl else "distributed_impl:ShardedMuon",
                probed=impl.probed if impl else (),
                reference=parts.algorithm.spec,
                kernel=kernel.spec if kernel else None,
                against=against,
                engine=parts.engine.spec if parts.engine is not None else "",
                replayed=replay.lines if replay is not None else (),
                threads=None if torchrun else config.getoption("rank_threads"),
            )
        )
        for part in self._unjudged_at_start(parts):
            runner.write(part)
        self.runner = runner
        self._flush_skips()
        try:
            yield runner
        finally:
            if progress is not None:
                progress.stop()
            pool.close()
            stream.close()

    def clear_report(self) -> None:
        """The report directory holds this run's files only: an earlier run's are removed, once, and
        the report line names them."""
        from reports.files import clear_report

        if self.cleared is None:
            self.cleared = clear_report(self.config.getoption("gate_report"))

    def _flush_skips(self) -> None:
        if self.runner is not None:
            for gate, reason in self.skips:
                self.runner.skip(gate, reason)
            self.skips = []

    def _streams(self) -> list[Path]:
        """This session's result streams: its own, or (xdist controller) every worker's."""
        if self.runner is not None and self.runner.stream.path is not None:
            return [self.runner.stream.path]
        if is_xdist_controller(self.config):
            return sorted(Path(self.config.getoption("gate_report")).glob("results-gw*.jsonl"))
        return []

    def _unjudged_at_start(self, resolved: Resolved) -> list[Any]:
        """The ledger's parts known to go unjudged before any gate runs: each captured parameter the
        replay leaves out (named by the user: it fails the session), and each layout the candidate
        declares that no case at this ``--nproc`` can lay out (shown, with the ``--nproc`` it needs)."""
        from harness import layouts
        from reports.records import Unjudged

        impl, replay = resolved.impl, resolved.replay
        parts = list(replay.unjudged) if replay is not None else []
        declared = sorted(impl.layouts) if impl is not None and not impl.probed else []
        for layout in map(layouts.named, declared):
            if layout.min_world > self.nproc:
                reason = f"needs --nproc {layout.min_world}; no case of it runs at --nproc {self.nproc}"
                parts.append(Unjudged(f"layout {layout.title}", reason, asked=False))
        return parts

    def _header_lines(self, parts: Resolved) -> list[str]:
        import hypothesis
        import torch

        from harness.ranks.relay import arrangement
        from harness.runinfo import cpu_line, muongate_commit, muongate_version
        from reports.summary import identity

        return [
            f"muongate {identity(muongate_version(), muongate_commit())}: torch {torch.__version__}, backend "
            f"{parts.backend} on {parts.device_kind}, nproc {self.nproc}, hypothesis "
            f"{hypothesis.__version__} profile {settings.get_current_profile_name()}",
            *[f"muongate ranks: {line}" for line in [arrangement(parts.backend, parts.devices)] if line],
            f"muongate CPU: {cpu_line(self.config.getoption('rank_threads'))}",
        ]

    # -- its pytest hooks ----------------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Where configure saw that the session runs gates, their profile, now that hypothesis's
        own plugin has loaded any ``--hypothesis-profile`` (and before the header shows it)."""
        if self.parts is not None:
            self.choose_profile()

    def pytest_collect_file(self, file_path: Path, parent: pytest.Collector) -> None:
        """A file of muongate's gates is about to be imported: its module-level ``settings()``
        must see the session's profile."""
        if not self.gates_seen and GATES in file_path.parents:
            self.choose_profile()

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """The session collected gates: now, before any rank starts, the devices and the plug-ins
        (a bad ``--impl`` is a usage error here when the arguments did not name the gates).

        Under torchrun every rank runs this session and must run the same tests in the same
        order. A plug-in that reorders tests per process (pytest-randomly draws its seed in each
        one) made every gate fail with "rank 1 drew a different case than rank 0"; so, after
        every other reordering, the tests run in the order of their files and lines."""
        if self.gates_seen or any(is_gate(item) for item in items):
            self.choose_profile()
            self.resolve()
            self._select_engine_gates(items)
            if launched_by_torchrun():
                items.sort(key=lambda item: (str(item.path), item.location[1] or 0, item.nodeid))

    def _select_engine_gates(self, items: list[pytest.Item]) -> None:
        """The engine gates (marked ``engine``) run under ``--engine``, and only they do: the other
        gates are deselected there, and the engine gates everywhere else, so that a session judges
        either an optimizer or an engine (and the main job runs no engine)."""
        engine = self.resolve().engine is not None
        keep: list[pytest.Item] = []
        drop: list[pytest.Item] = []
        for item in items:
            gate = item.get_closest_marker("gate") is not None
            (keep if not gate or (item.get_closest_marker("engine") is not None) == engine else drop).append(item)
        if drop:
            self.config.hook.pytest_deselected(items=drop)
            items[:] = keep

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        """The muongate line, where the arguments named the gates; otherwise it waits for collection."""
        if self.parts is None:
            return []
        self.header_shown = True
        return self._header_lines(self.parts)

    def pytest_report_collectionfinish(self, config: pytest.Config, items: list[pytest.Item]) -> list[str]:
        """The muongate line, after collection, for gates that the arguments did not name."""
        if self.parts is None or self.header_shown:
            return []
        if config.get_verbosity() < 0 or config.getoption("no_header", False):
            return []  # where the header is not shown
        return self._header_lines(self.parts)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        """A gate's figures go into its report's properties (``--junitxml``); a failed gate shows
        its verdict and hypothesis's notes; a skipped gate goes into the stream with its reason,
        so the report shows what did not run."""
        runner = self.runner
        if call.when == "call" and runner is not None:
            for gate, g in runner.figures.get(item.nodeid, {}).items():
                figures = {
                    "cases": g.cases,
                    "failed": g.failed_cases,
                    "comparisons": g.comparisons,
                    "bitwise": g.bitwise,
                    "worst_max_abs_diff": g.worst_abs_diff or 0.0,
                }
                item.user_properties += [(f"{gate}.{key}", value) for key, value in figures.items()]
        report = yield
        failure = call.excinfo.value if call.excinfo is not None else None
        if call.when == "call" and runner is not None:
            runner.finished(item.nodeid, report.failed)
        if runner is not None and report.failed and _is_already_shrunk(failure):
            report.longrepr = str(failure)
        if report.failed and isinstance(failure, pytest.fail.Exception) and not failure.pytrace:
            # A verdict is shown without a traceback; what hypothesis adds to it (the falsifying
            # example, the @reproduce_failure blob) still belongs under it.
            notes = getattr(failure, "__notes__", [])
            if notes:
                report.longrepr = "\n".join([str(report.longrepr), *notes])
        findings = _findings(failure)
        if report.failed and findings:
            # Hypothesis found several distinct failures (``harness.runner.FINDINGS``), each shrunk.
            report.longrepr = "\n\n".join(
                f"finding {i} of {len(findings)}: " + "\n".join([str(f), *getattr(f, "__notes__", [])])
                for i, f in enumerate(findings, 1)
            )
        if report.skipped and item.get_closest_marker("gate") is not None:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            self.skips.append((item.nodeid, reason.removeprefix("Skipped: ")))
            self._flush_skips()
        return report

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """A test marked ``judges`` did not run an ``--impl`` candidate: it never reports on one."""
        marker = item.get_closest_marker("judges")
        impl = self.parts.impl if self.parts is not None else None
        if marker is not None and impl is not None:
            alone = "--impl" if self.config.getoption("impl") else f"--reference {self.config.getoption('reference')}"
            pytest.skip(f"judges {marker.args[0]}, not {impl.spec}; it runs without {alone}")

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> None:
        if self.runner is not None:
            marker = item.get_closest_marker("judges")
            self.runner.begin(item.nodeid, str(item.path), "candidate" if marker is None else marker.args[1])

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.session = session  # under torchrun its exit status is the rank's (``pytest_unconfigure``)

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """A torchrun rank whose process group ran leaves here, with the session's exit status and
        without the interpreter's teardown: torch's gloo threads outlive ``destroy_process_group``
        once DTensor ran, and can abort a finished rank there (matrix finding 35,
        ``examples/findings/torch_gloo_threads_outlive_destroy.py``). The pool's ranks leave so too."""
        if self.runner is None or not launched_by_torchrun():
            return
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(self.session.exitstatus) if self.session is not None else 1)


def _says_it_runs_gates(config: pytest.Config) -> bool:
    """Whether an option that only gates use was given, or the session's arguments (or
    testpaths) are muongate's gates, in them, or above them."""
    if config.getoption("gate_device") != "auto" or config.getoption("gate_comm") != "auto":
        return True
    if any(
        config.getoption(name) is not None
        for name in ("nproc", "impl", "engine", "reference", "kernel", "model", "rank_threads", "layout_from")
    ):
        return True
    for arg in config.args:
        name = arg.split("::")[0]
        paths = [Path(config.invocation_params.dir, name)]
        top = name.split(".")[0]
        if config.option.pyargs and top.isidentifier():
            spec = importlib.util.find_spec(top)  # a top-level name: nothing is imported
            if spec is not None and spec.origin is not None:
                paths.append(Path(spec.origin).parent)
        for path in paths:
            path = path.resolve()
            if path == GATES or GATES in path.parents or path in GATES.parents:
                return True
    return False


def is_gate(item: pytest.Item) -> bool:
    """A test the gates judge: marked ``gate``, or using the pool through ``gate_runner`` or ``gate_model``."""
    uses = getattr(item, "fixturenames", ())
    return item.get_closest_marker("gate") is not None or "gate_runner" in uses or "gate_model" in uses


def _findings(failure: BaseException | None) -> list[BaseException]:
    """The findings of a test that failed in several distinct ways (an exception group of them)."""
    if not isinstance(failure, BaseExceptionGroup):
        return []
    from harness.runner import AlreadyShrunk, Finding

    members = list(failure.exceptions)
    return members if all(isinstance(m, (Finding, AlreadyShrunk)) for m in members) else []


def _is_already_shrunk(failure: BaseException | None) -> bool:
    from harness.runner import AlreadyShrunk

    return isinstance(failure, AlreadyShrunk)
