"""What a session of gates judges, resolved once from its options (``resolve``): where the ranks
compute, the candidate (``--impl``, or the one muongate ships for ``--reference``'s family), the
family it is judged against (``harness.algorithms.judged_family``), the engine, the capture
``--layout-from`` replays, the kernel and the model. Any problem is a one-line usage error."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.plugin.devices import resolve_device


@dataclass(frozen=True)
class Resolved:
    """A session's resolved plug-ins and devices."""

    backend: str
    devices: list[str]
    #: the candidate (``harness.candidates.Impl``; ``None``: muongate's ShardedMuon)
    impl: Any
    #: the family it is judged against (``harness.algorithms.Algorithm``)
    algorithm: Any
    #: ``--engine`` (``harness.engines.LoadedEngine``), ``--layout-from`` (``harness.replay.Replay``),
    #: ``--kernel`` (``harness.candidates.Kernel``), ``--model`` (``harness.models.plugin.ModelCase``)
    engine: Any
    replay: Any
    kernel: Any
    model: Any

    @property
    def thresholds(self) -> tuple[int, ...]:
        """The sizes at which the candidate changes behaviour (``Candidate.thresholds``)."""
        if self.impl is None:
            return ()
        from harness.candidates import declaration_of

        return tuple(declaration_of(self.impl.factory).thresholds)

    @property
    def device_kind(self) -> str:
        """What the ranks compute on, ``"cpu"`` or ``"cuda"``."""
        return _kind(self.devices)


def resolve(config: pytest.Config, nproc: int) -> Resolved:
    """The devices and the plug-ins of the session ``config`` configures, on ``nproc`` ranks."""
    from harness.algorithms import MUON, built_in
    from harness.candidates import Impl

    backend, devices = resolve_device(config, nproc)
    impl = _load(config, "impl", Impl.load, "MODULE:FACTORY")
    if config.getoption("probe_undeclared"):
        if impl is None:
            raise pytest.UsageError("--probe-undeclared probes an --impl candidate: add --impl MODULE:FACTORY")
        impl = impl.probing()
    algorithm = _algorithm(config, impl)
    if impl is None and algorithm.factory not in (MUON.factory, None):
        # --reference alone: the family's own candidate, as if named (``FAMILIES``), so that
        # what runs is judged and shown as that candidate, never as muongate's Muon
        impl = Impl.load(built_in(algorithm))
    if impl is not None:
        impl = impl.judged_against(algorithm)
    return Resolved(
        backend=backend,
        devices=devices,
        impl=impl,
        algorithm=algorithm,
        engine=_engine(config, _kind(devices)),
        replay=_replay(config, nproc, algorithm),
        kernel=_kernel(config),
        model=_model(config),
    )


def _kind(devices: list[str]) -> str:
    """What ``devices`` compute on, ``"cpu"`` or ``"cuda"`` (rank 0's device without its index)."""
    return devices[0].split(":")[0]


def _algorithm(config: pytest.Config, impl: Any) -> Any:
    from harness.algorithms import Algorithm, judged_family

    spec = config.getoption("reference")
    named = _load(config, "reference", Algorithm.load, "MODULE:CLASS") if spec is not None else None
    try:
        return judged_family(named, spec, impl, config.getoption("against"))
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None


def _engine(config: pytest.Config, device_kind: str) -> Any:
    from harness.engines import LoadedEngine

    if config.getoption("engine") and config.getoption("impl"):
        raise pytest.UsageError(
            "--engine with --impl: the engine gates judge the engine's own optimizer, the others the candidate; use one"
        )
    engine = _load(config, "engine", LoadedEngine.load, "MODULE:FACTORY")
    refused = engine.refusal(device_kind) if engine is not None else None
    if refused:
        raise pytest.UsageError(f"--engine {engine.spec}: {refused}")
    return engine


def _replay(config: pytest.Config, nproc: int, algorithm: Any) -> Any:
    """``--layout-from=FILE`` as the cases the replay gate runs (``harness.replay``); a file that
    cannot be read, or of which nothing can be replayed, is a usage error naming why."""
    path = config.getoption("layout_from")
    if path is None:
        return None
    from harness.capture import CaptureError, load_capture
    from harness.replay import replay

    try:
        capture = load_capture(path)
    except CaptureError as e:
        raise pytest.UsageError(f"--layout-from {e}") from None
    replayed = replay(capture, nproc=nproc, algorithm=algorithm)
    if not replayed.meshes:
        from reports.summary import unjudged_lines

        why = unjudged_lines(replayed.unjudged)
        raise pytest.UsageError("\n".join([f"--layout-from {path}: nothing of it can be replayed:", *why]))
    return replayed


def _model(config: pytest.Config) -> Any:
    if config.getoption("model") is None:
        return None  # without importing the models (FSDP2, the transformer): 0.4 s of every process's start
    from harness.models.plugin import ModelCase

    return _load(config, "model", ModelCase.load, "MODULE:FACTORY")


def _kernel(config: pytest.Config) -> Any:
    from harness.candidates import Kernel

    if config.getoption("kernel") and config.getoption("impl"):
        raise pytest.UsageError("--kernel with --impl: a plug-in optimizer brings its own Newton-Schulz; use one")
    return _load(config, "kernel", Kernel.load, "MODULE:FN")


def _load(config: pytest.Config, option: str, load: Callable[[str], Any], form: str) -> Any:
    """``--option MODULE:NAME`` (or ``path/to/file.py:NAME``) loaded by ``load``; any error in
    importing its module, or in its declaration, is a one-line usage error."""
    from harness.candidates.loading import PluginImportError, import_spec, is_file_spec

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
