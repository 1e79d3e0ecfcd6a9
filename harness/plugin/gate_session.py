"""One session of gates: the object the plug-in registers with pytest for each session
(``harness.plugin.pytest_configure``), which owns everything the session resolves and runs:
the pool's size and devices (asked of ``harness.plugin.devices``), the
``--impl``/``--reference``/``--engine``/``--kernel``/``--model`` and ``--layout-from`` plug-ins,
the hypothesis profile, the runner and its stream, and the skips on their way to it. The exit
status and the report at the end are the verdict's (``harness.plugin.verdict``), a plug-in of its
own that this object makes and the plug-in registers beside it. Its methods are the session's
pytest hooks; nothing of it lives at module level, so that a session pytester starts inside
another has an object of its own.

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings

from harness.plugin.devices import is_xdist_controller, launched_by_torchrun, resolve_device, xdist_worker
from harness.plugin.options import PROFILE_VARIABLE
from harness.plugin.verdict import Verdict

# Profiles are only registered here; a session that runs gates loads one (``GateSession.choose_profile``).
# Distributed cases take milliseconds to seconds, so hypothesis's per-example deadline is off;
# the pool's own deadline bounds each case. "ci" is derandomized so CI runs are repeatable.
# No explain phase: it re-runs a failing case about a hundred times more to annotate
# hypothesis's drawn case (30.6 s of a 43 s cause-gate session that found a bug), and the
# report prints the case as it ran with the fields that differ from the defaults;
# --hypothesis-explain brings it back.
_BASE = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)
settings.register_profile("dev", _BASE, max_examples=20)
settings.register_profile("thorough", _BASE, max_examples=2000)
DEFAULT_PROFILE = "ci"


def register_gate_ci_profile() -> None:
    """Registers muongate's ``ci`` profile (200 examples, derandomized, no deadline).

    Only where gates run, never at import: hypothesis has a ``ci`` profile of its own, which
    it loads by itself where the ``CI`` variable is set, and registering a profile under the
    name that is loaded loads it, so that every other project's tests on a CI machine with
    muongate installed would run on muongate's settings."""
    settings.register_profile(DEFAULT_PROFILE, _BASE, max_examples=200, derandomize=True)


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
        #: whether the devices and plug-ins are resolved (once, on the first sign of gates)
        self.resolved = False
        self.backend = ""
        self.devices: list[str] = []
        self.impl: Any = None
        self.algorithm: Any = None
        self.engine: Any = None
        self.replay: Any = None
        self.kernel: Any = None
        self.model: Any = None
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
        thresholds: tuple[int, ...] = ()
        if self.impl is not None:
            from harness.candidates import declaration_of

            thresholds = tuple(declaration_of(self.impl.factory).thresholds)
        return GateConfig(
            nproc=self.nproc,
            algorithm=self.algorithm,
            thresholds=thresholds,
            engine=self.engine,
            replay=self.replay,
            device=self.device_kind,
        )

    @property
    def device_kind(self) -> str:
        """What the ranks compute on, ``"cpu"`` or ``"cuda"`` (``"cpu"`` until resolved)."""
        return self.devices[0].split(":")[0] if self.devices else "cpu"

    # -- resolving the session, once ---------------------------------------------------------------
    def choose_profile(self) -> None:
        """Loads the gates' hypothesis profile, unless the user chose one: ``--hypothesis-profile``
        (hypothesis's plugin loads it), ``MUONGATE_HYPOTHESIS_PROFILE``, or one their conftest
        loaded; else ``ci``."""
        if self.gates_seen:
            return
        self.gates_seen = True
        current = settings.get_current_profile_name()
        register_gate_ci_profile()  # where hypothesis had loaded its own ci (a CI machine), ours replaces it
        if self.config.getoption("hypothesis_profile", None):
            pass
        elif os.environ.get(PROFILE_VARIABLE):
            _load_profile(os.environ[PROFILE_VARIABLE])
        elif current in ("default", DEFAULT_PROFILE) or current.startswith("default-with-"):
            _load_profile(DEFAULT_PROFILE)
        _fix_seed(self.config)
        if launched_by_torchrun():
            # Every rank must draw the same examples in the same order: no randomness, no database.
            settings.register_profile("torchrun", settings.default, derandomize=True, database=None)
            settings.load_profile("torchrun")

    def resolve(self) -> None:
        """The devices and the plug-ins, once; any problem is a usage error."""
        if self.resolved:
            return
        from harness.algorithms import MUON, built_in
        from harness.candidates import Impl

        config = self.config
        self.backend, self.devices = resolve_device(config, self.nproc)
        self.impl = self._load_plugin("impl", Impl.load, "MODULE:FACTORY")
        if config.getoption("probe_undeclared"):
            if self.impl is None:
                raise pytest.UsageError("--probe-undeclared probes an --impl candidate: add --impl MODULE:FACTORY")
            self.impl = self.impl.probing()
        self.algorithm = self._algorithm()
        if self.impl is None and self.algorithm.factory not in (MUON.factory, None):
            # --reference alone: the family's own candidate, as if named (``FAMILIES``), so that
            # what runs is judged and shown as that candidate, never as muongate's Muon
            self.impl = Impl.load(built_in(self.algorithm))
        if self.impl is not None:
            self.impl = self.impl.judged_against(self.algorithm)
        self.engine = self._engine()
        self.replay = self._replay()
        self.kernel = self._kernel()
        self.model = self._model()
        self.resolved = True

    def _engine(self) -> Any:
        from harness.engines import LoadedEngine

        if self.config.getoption("engine") and self.config.getoption("impl"):
            raise pytest.UsageError(
                "--engine with --impl: the engine gates judge the engine's own optimizer, the others the candidate; use one"
            )
        engine = self._load_plugin("engine", LoadedEngine.load, "MODULE:FACTORY")
        refused = engine.refusal(self.device_kind) if engine is not None else None
        if refused:
            raise pytest.UsageError(f"--engine {engine.spec}: {refused}")
        return engine

    def _replay(self) -> Any:
        """``--layout-from=FILE`` as the cases the replay gate runs (``harness.replay``); a file that
        cannot be read, or of which nothing can be replayed, is a usage error naming why."""
        from harness.capture import CaptureError, load_capture
        from harness.replay import replay

        path = self.config.getoption("layout_from")
        if path is None:
            return None
        try:
            capture = load_capture(path)
        except CaptureError as e:
            raise pytest.UsageError(f"--layout-from {e}") from None
        replayed = replay(capture, nproc=self.nproc, algorithm=self.algorithm)
        if not replayed.meshes:
            from reports.summary import unjudged_lines

            why = unjudged_lines(replayed.unjudged)
            raise pytest.UsageError("\n".join([f"--layout-from {path}: nothing of it can be replayed:", *why]))
        return replayed

    def _algorithm(self) -> Any:
        """The session's reference (``harness.algorithms``): ``--reference``, else the one the
        ``--impl`` candidate declares, else ``reference.Muon``; a conflict is a usage error."""
        from harness.algorithms import FAMILIES, MUON, NO_REFERENCE, Algorithm

        spec, impl = self.config.getoption("reference"), self.impl
        declared = impl.algorithm if impl is not None and impl.declares_reference else None
        if spec is None:
            return declared or MUON
        algorithm = self._load_plugin("reference", Algorithm.load, "MODULE:CLASS")
        if algorithm is NO_REFERENCE:
            if impl is None or self.config.getoption("against") != "self":
                raise pytest.UsageError(
                    "--reference none judges a candidate against itself on one device only: "
                    "add --impl MODULE:FACTORY --against self"
                )
            return algorithm
        if declared is not None and declared.spec != algorithm.spec:
            raise pytest.UsageError(
                f"--reference {spec} with --impl {impl.spec}, which declares reference {declared.spec}: drop --reference"
            )
        if impl is not None and (refused := algorithm.unknown_causes(impl.differences)):
            raise pytest.UsageError(f"--reference {spec} with --impl {impl.spec}: its Candidate {refused}")
        if impl is None and algorithm.factory is not MUON.factory and FAMILIES.get(algorithm.spec) is None:
            raise pytest.UsageError(
                f"--reference {spec}: muongate ships no candidate of {algorithm.name}; name one with --impl MODULE:FACTORY"
            )
        return algorithm

    def _model(self) -> Any:
        from harness.models.plugin import ModelCase

        return self._load_plugin("model", ModelCase.load, "MODULE:FACTORY")

    def _kernel(self) -> Any:
        from harness.candidates import Kernel

        if self.config.getoption("kernel") and self.config.getoption("impl"):
            raise pytest.UsageError("--kernel with --impl: a plug-in optimizer brings its own Newton-Schulz; use one")
        return self._load_plugin("kernel", Kernel.load, "MODULE:FN")

    def _load_plugin(self, option: str, load: Callable[[str], Any], form: str) -> Any:
        """``--option MODULE:NAME`` (or ``path/to/file.py:NAME``) loaded by ``load``; any error in
        importing its module, or in its declaration, is a one-line usage error."""
        from harness.candidates.loading import PluginImportError, import_spec, is_file_spec

        config = self.config
        spec = config.getoption(option)
        if spec is None:
            return None
        try:
            named = import_spec(option, spec, form)  # the loaders, and the ranks, import the module by its name
        except PluginImportError as e:
            raise pytest.UsageError(str(e)) from e
        if is_file_spec(spec):
            # The reproduce commands repeat this option, and run from any directory.
            module_part, _, attr = spec.rpartition(":")
            setattr(config.option, option, f"{Path(module_part).resolve()}:{attr}")
        try:
            return load(named)
        except (ImportError, AttributeError, TypeError, ValueError) as e:
            said = str(e).removeprefix(f"--{option} {spec}: ").removeprefix(f"--{option} {named}: ")  # they name it too
            # a name the module lacks, or that is not of the form, gets the form; a declaration it refuses does not
            where = "" if isinstance(e, ValueError) else f"; expected {form} importable from here"
            raise pytest.UsageError(f"--{option} {spec}: {said}{where}") from e

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
        self.resolve()
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
        replay = self.replay
        grids = replay.grids if replay is not None else ()
        if torchrun:
            pool = LauncherGroup(backend=self.backend, device=self.devices[0], timeout_s=timeout, grids=grids)
        else:
            threads = config.getoption("rank_threads")
            pool = RankPool(
                self.nproc,
                backend=self.backend,
                devices=self.devices,
                case_timeout_s=timeout,
                threads=threads,
                grids=grids,
                preload=RANK_PRELOAD,
            )
        tty = terminal() if writes_report else None
        progress = CaseProgress.start(tty) if tty is not None else None
        impl, kernel = self.impl, self.kernel
        against = config.getoption("against")
        seed = config.getoption("hypothesis_seed", None)
        rerun = Rerun(
            device=self.device_kind,
            profile=settings.get_current_profile_name(),
            seed=None if seed is None else str(seed),
            model=config.getoption("model"),
            engine=config.getoption("engine"),
            reference=config.getoption("reference"),
            layout_from=str(replay.capture.path.resolve()) if replay is not None else None,
        )
        runner = GateRunner(
            pool, stream, launcher=torchrun, on_case=progress, impl=impl, kernel=kernel, against=against, rerun=rerun,
            algorithm=self.algorithm,
        )  # fmt: skip
        runner.start(
            make_header(
                backend=self.backend,
                devices=self.devices,
                nproc=self.nproc,
                hypothesis_profile=settings.get_current_profile_name(),
                hypothesis_seed=None if seed is None else str(seed),
                impl=impl.spec if impl else "distributed_impl:ShardedMuon",
                probed=impl.probed if impl else (),
                reference=self.algorithm.spec,
                kernel=kernel.spec if kernel else None,
                against=against,
                engine=self.engine.spec if self.engine is not None else "",
                replayed=replay.lines if replay is not None else (),
                threads=None if torchrun else config.getoption("rank_threads"),
            )
        )
        for part in self._unjudged_at_start():
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

    def _unjudged_at_start(self) -> list[Any]:
        """The ledger's parts known to go unjudged before any gate runs: each captured parameter the
        replay leaves out (named by the user: it fails the session), and each layout the candidate
        declares that no case at this ``--nproc`` can lay out (shown, with the ``--nproc`` it needs)."""
        from harness import layouts
        from reports.records import Unjudged

        parts = list(self.replay.unjudged) if self.replay is not None else []
        declared = sorted(self.impl.layouts) if self.impl is not None and not self.impl.probed else []
        for layout in map(layouts.named, declared):
            if layout.min_world > self.nproc:
                reason = f"needs --nproc {layout.min_world}; no case of it runs at --nproc {self.nproc}"
                parts.append(Unjudged(f"layout {layout.title}", reason, asked=False))
        return parts

    def _header_lines(self) -> list[str]:
        import hypothesis
        import torch

        from harness.ranks.relay import arrangement
        from harness.runinfo import cpu_line, muongate_commit, muongate_version
        from reports.summary import identity

        return [
            f"muongate {identity(muongate_version(), muongate_commit())}: torch {torch.__version__}, backend "
            f"{self.backend} on {self.devices[0].split(':')[0]}, nproc {self.nproc}, hypothesis "
            f"{hypothesis.__version__} profile {settings.get_current_profile_name()}",
            *[f"muongate ranks: {line}" for line in [arrangement(self.backend, self.devices)] if line],
            f"muongate CPU: {cpu_line(self.config.getoption('rank_threads'))}",
        ]

    # -- its pytest hooks ----------------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Where configure saw that the session runs gates, their profile, now that hypothesis's
        own plugin has loaded any ``--hypothesis-profile`` (and before the header shows it)."""
        if self.resolved:
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
        if self.gates_seen or any(_is_gate(item) for item in items):
            self.choose_profile()
            self.resolve()
            self._select_engine_gates(items)
            if launched_by_torchrun():
                items.sort(key=lambda item: (str(item.path), item.location[1] or 0, item.nodeid))

    def _select_engine_gates(self, items: list[pytest.Item]) -> None:
        """The engine gates (marked ``engine``) run under ``--engine``, and only they do: the other
        gates are deselected there, and the engine gates everywhere else, so that a session judges
        either an optimizer or an engine (and the main job runs no engine)."""
        engine = self.engine is not None
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
        if not self.resolved:
            return []
        self.header_shown = True
        return self._header_lines()

    def pytest_report_collectionfinish(self, config: pytest.Config, items: list[pytest.Item]) -> list[str]:
        """The muongate line, after collection, for gates that the arguments did not name."""
        if not self.resolved or self.header_shown:
            return []
        if config.get_verbosity() < 0 or config.getoption("no_header", False):
            return []  # where the header is not shown
        return self._header_lines()

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
        if marker is not None and self.impl is not None:
            alone = "--impl" if self.config.getoption("impl") else f"--reference {self.config.getoption('reference')}"
            pytest.skip(f"judges {marker.args[0]}, not {self.impl.spec}; it runs without {alone}")

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


def _is_gate(item: pytest.Item) -> bool:
    uses = getattr(item, "fixturenames", ())
    return item.get_closest_marker("gate") is not None or "gate_runner" in uses or "gate_model" in uses


def _load_profile(name: str) -> None:
    current = settings.get_current_profile_name()
    if current.startswith("default-with-"):
        # hypothesis's plugin derived the default profile for --hypothesis-verbosity or
        # --hypothesis-explain before the gates were seen; derive ours the same way.
        derived = name + current.removeprefix("default")
        here = settings()  # the current profile's values
        settings.register_profile(derived, settings.get_profile(name), verbosity=here.verbosity, phases=here.phases)
        name = derived
    settings.load_profile(name)


def _fix_seed(config: pytest.Config) -> None:
    """Under a profile that draws at random, a session without ``--hypothesis-seed`` gets one,
    so that its reproduce commands draw the same cases."""
    import random

    from hypothesis import core

    if not settings().derandomize and config.getoption("hypothesis_seed", None) is None:
        seed = random.randrange(2**32)
        config.option.hypothesis_seed = str(seed)
        core.global_force_seed = seed  # type: ignore[assignment]  # as hypothesis's plugin does with --hypothesis-seed


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
