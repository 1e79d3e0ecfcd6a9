"""The muongate options, and their checks: every value is checked in ``pytest_configure``,
so a bad one is a one-line usage error that says the fix, before any rank starts."""

from __future__ import annotations

import math
import os
import shlex
from itertools import pairwise
from pathlib import Path

import pytest

DEFAULT_REPORT_DIR = "gate-report"
PROFILE_VARIABLE = "MUONGATE_HYPOTHESIS_PROFILE"


def add_options(parser: pytest.Parser) -> None:
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
        help="where ranks run: cpu (gloo), cuda (NCCL with one GPU a rank; ranks share the GPUs through "
        "the relay where there are fewer, see --gate-comm), or auto: cuda when at least --nproc GPUs are "
        "visible, else cpu (default: auto).",
    )
    group.addoption(
        "--gate-comm",
        choices=("auto", "native", "relay"),
        default="auto",
        help="how ranks communicate: native (gloo on CPU, NCCL with one GPU a rank), relay (every collective "
        "copied to the CPU and run on gloo there: how ranks share a GPU; on CPU, a test of the relay), or auto: "
        "native, and relay where --gate-device cuda has fewer GPUs than ranks (default: auto).",
    )
    group.addoption(
        "--case-timeout",
        type=float,
        default=120.0,
        help="wall-clock seconds one distributed case may take before its ranks are dumped and killed (default: "
        "120); a CPU rank still computing outside any collective gets up to four times as long.",
    )
    group.addoption(
        "--rank-threads",
        type=int,
        default=None,
        metavar="N",
        help="torch threads per CPU rank (default: OMP_NUM_THREADS where set, else the usable cores over the live "
        "ranks of every muongate pool on the host, xdist workers and concurrent runs included).",
    )
    group.addoption(
        "--impl",
        metavar="MODULE:FACTORY",
        default=None,
        help="put this optimizer factory in place of distributed_impl.ShardedMuon in every optimizer gate "
        "(what it declares about itself: harness.candidates.Candidate, in harness/candidates/declaration.py).",
    )
    group.addoption(
        "--engine",
        metavar="MODULE:FACTORY",
        default=None,
        help="judge this sharding engine (FACTORY(model, config, group), e.g. DeepSpeed's ZeRO: "
        "examples/deepspeed_adapter.py) in the engine gates, and run only those (the contract: harness/engines).",
    )
    group.addoption(
        "--reference",
        metavar="MODULE:CLASS",
        default=None,
        help="the single-device reference optimizer the candidate is judged against (default: the one the --impl "
        "candidate declares, else reference:Muon; e.g. reference:AdamW), or none: any torch.optim.Optimizer judged "
        "against itself on one device only (with --against self). Its declarations are in harness/algorithms.py.",
    )
    group.addoption(
        "--model",
        metavar="MODULE:FACTORY",
        default=None,
        help="also train this model (FACTORY() -> nn.Module) through the training gates: the single-process "
        "comparison and the training twins (the contract is in harness/models/plugin.py and the README).",
    )
    group.addoption(
        "--layout-from",
        metavar="FILE",
        default=None,
        help="also replay the layout a job captured (harness.capture): the replay gate runs the optimizer on "
        "exactly its parameters and placements, on a reduced mesh that keeps their pieces where the job had more "
        "ranks than --nproc; the report's header says what was kept.",
    )
    group.addoption(
        "--kernel",
        metavar="MODULE:FN",
        default=None,
        help="a Newton-Schulz kernel FN(matrix, steps) -> matrix: every optimizer gate runs it on both sides, "
        "and the kernel gates measure it against the reference (contract: harness/candidates/kernel.py, README).",
    )
    group.addoption(
        "--against",
        choices=("reference", "self"),
        default="reference",
        help="what the optimizer gates judge the candidate against: reference (the session's reference, default) "
        "or self (the same candidate on one device, so that sharding bugs show even where its arithmetic "
        "differs from the reference by design; the reference's verdict is still shown beside it).",
    )
    group.addoption(
        "--probe-undeclared",
        action="store_true",
        default=False,
        help="run the --impl candidate on the features and layouts it does not declare too, instead of narrowing "
        "or skipping them, to see what its package does there (the matrix's probe; its verdicts are not the "
        "candidate's contract). A gate whose claim is an undeclared feature probes that feature alone.",
    )
    group.addoption(
        "--allow-unjudged",
        action="store_true",
        default=False,
        help="exit 0 even where the session judged nothing of the --impl or --engine candidate (every gate skipped, "
        "narrowed away or not judged); without it such a session fails, naming why, and still writes the report.",
    )
    group.addoption(
        "--gate-baseline",
        metavar="FILE",
        default=None,
        help="a figures.json from an earlier run: the session fails if a gate that was bitwise no longer is, "
        "or its worst error or singular-value band got worse beyond the stated margins.",
    )
    group.addoption(
        "--accept",
        metavar="FILE",
        default=None,
        help="a TOML file of accepted findings (harness/plugin/accepted.py): a gate test whose every failing gate "
        "one of them covers, for the release installed, is xfailed and shown as accepted, never as bitwise; "
        "anything else red stays red. Write --accept=FILE.",
    )
    group.addoption(
        "--gate-report",
        default=DEFAULT_REPORT_DIR,
        metavar="DIR",
        help=f"directory for results.jsonl, equivalence.html and equivalence.md (default: {DEFAULT_REPORT_DIR}); "
        "write --gate-report=DIR: pytest takes the DIR of --gate-report DIR for a test path when it chooses its rootdir.",
    )


def check_options(config: pytest.Config) -> None:
    """Raises ``pytest.UsageError`` for the first option value that cannot work."""
    _check_path_spelling(config)
    nproc = config.getoption("nproc")
    if nproc is not None and nproc < 1:
        raise pytest.UsageError(f"--nproc {nproc}: the pool needs at least one rank; try --nproc 2")
    timeout = config.getoption("case_timeout")
    if not (math.isfinite(timeout) and timeout > 0):
        raise pytest.UsageError(
            f"--case-timeout {timeout:g}: a case needs a positive, finite number of seconds; try --case-timeout 120"
        )
    threads = config.getoption("rank_threads")
    if threads is not None and threads < 1:
        raise pytest.UsageError(f"--rank-threads {threads}: a rank needs at least one thread; try --rank-threads 1")
    report = Path(config.getoption("gate_report"))
    if report.exists() and not report.is_dir():
        raise pytest.UsageError(
            f"--gate-report {report}: that is a file; name a directory, e.g. --gate-report=gate-report"
        )
    _check_profile(config)


#: the options whose value is a path: pytest chooses its rootdir and configfile before any plug-in's
#: options are known, so the value of ``--gate-report DIR`` (two tokens) is a test path to it there
_PATH_OPTIONS = ("--gate-report", "--gate-baseline", "--layout-from", "--accept")


def _check_path_spelling(config: pytest.Config) -> None:
    """Refuses a path option spelled as two tokens whose value made pytest choose another rootdir or
    configfile than the session's own arguments would have (then the project's configuration, its
    markers and its node ids are lost, and nothing a plug-in does afterwards brings them back)."""
    args = [*shlex.split(os.environ.get("PYTEST_ADDOPTS", "")), *map(str, config.invocation_params.args)]
    if "--" in args:  # after it every token is a test path
        args = args[: args.index("--")]
    given = [(option, value) for option, value in pairwise(args) if option in _PATH_OPTIONS]
    if not given:
        return
    try:
        from _pytest.config.findpaths import determine_setup
    except ImportError:  # a pytest without it: the session goes on as pytest set it up
        return

    def setup(paths: list[str]) -> tuple[Path, Path | None]:
        rootpath, inipath, *_ = determine_setup(
            inifile=config.option.inifilename,
            override_ini=config.option.override_ini,
            args=paths,
            rootdir_cmd_arg=config.option.rootdir or None,
            invocation_dir=config.invocation_params.dir,
        )
        return rootpath, inipath

    positional = [str(a) for a in config.getoption("file_or_dir") or []]
    chosen = (config.rootpath, config.inipath)
    right = setup(positional)
    for option, value in given:
        if right != chosen and setup([*positional, value]) == chosen:
            raise pytest.UsageError(
                f"{option} {value}: pytest took {value} for a test path when it chose its rootdir {chosen[0]} and "
                f"configfile {chosen[1] or '(none)'}, before it knew muongate's options (without it: {right[0]} and "
                f"{right[1] or '(none)'}); write {option}={value}"
            )


def _check_profile(config: pytest.Config) -> None:
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument

    for name, where in (
        (config.getoption("hypothesis_profile", None), "--hypothesis-profile"),
        (os.environ.get(PROFILE_VARIABLE), PROFILE_VARIABLE),
    ):
        if name is None:
            continue
        try:
            settings.get_profile(name)
        except InvalidArgument:
            raise pytest.UsageError(f"{where} {name}: no such hypothesis profile; try ci, dev or thorough") from None
