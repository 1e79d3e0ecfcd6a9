"""The ``reproduce:`` command of a failure: one line that reruns the failing test from any
directory, with everything the run was given.

It names the test so that pytest finds it from anywhere (``--pyargs gates.…`` for
muongate's own gates, the file's absolute path otherwise), loads the plug-in by name
(``-p harness.plugin``: harmless where the entry point already loads it), puts the roots of
muongate, the candidate and the kernel on ``PYTHONPATH``, and repeats every option that
decides which cases run and how: ``--nproc``, ``--impl``, ``--kernel``, ``--model``, ``--against``,
``--gate-device`` and hypothesis's profile and seed. Under the ``ci`` profile the cases are
derandomized, so the rerun draws the same ones; under a random profile the session's seed
is fixed (``harness.plugin`` picks one when none is given) and repeated here.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


def module_root(module: str) -> str:
    """The directory that has to be on ``sys.path`` for ``module`` to import."""
    top = module.split(".")[0]
    loaded = sys.modules.get(top)
    file = getattr(loaded, "__file__", None)
    if file is None:
        return ""
    path = Path(file).resolve()
    return str(path.parent.parent if path.name == "__init__.py" else path.parent)


@dataclass(frozen=True)
class Rerun:
    """What a reproduce command has to repeat about the session."""

    nproc: int = 2
    launcher: bool = False
    impl: str | None = None
    kernel: str | None = None
    model: str | None = None
    engine: str | None = None
    #: ``--reference`` as the user gave it (``None``: the session's default)
    reference: str | None = None
    against: str = "reference"
    #: ``--layout-from`` as the user gave it, made absolute
    layout_from: str | None = None
    device: str = "cpu"
    profile: str = "ci"
    seed: str | None = None

    def command(self, path: str, test: str) -> str:
        """The command for ``test`` (its name, parameters included) of the file ``path``."""
        target, pyargs = self._target(Path(path).resolve(), test)
        options = ["-p", "harness.plugin", *(["--pyargs"] if pyargs else []), target]
        if not self.launcher:
            options += ["--nproc", str(self.nproc)]
        options += _pairs(
            ("--impl", self.impl),
            ("--reference", self.reference),
            ("--kernel", self.kernel),
            ("--model", self.model),
            ("--engine", self.engine),
            ("--layout-from", self.layout_from),
            ("--against", None if self.against == "reference" else self.against),
            ("--gate-device", None if self.device == "cpu" else self.device),
            ("--hypothesis-profile", None if self.profile == "ci" else self.profile),
            ("--hypothesis-seed", self.seed),
        )
        launch = f"torchrun --nproc-per-node {self.nproc} -m pytest" if self.launcher else "python -m pytest"
        return f"PYTHONPATH={shlex.quote(self._path())} {launch} {shlex.join(options)}"

    def _target(self, path: Path, test: str) -> tuple[str, bool]:
        gates = Path(module_root("gates"), "gates") if "gates" in sys.modules else None
        if gates is not None and path.parent == gates and path.suffix == ".py":
            return f"gates.{path.stem}::{test}", True
        return f"{path}::{test}", False

    def _path(self) -> str:
        specs = [s for s in (self.impl, self.reference, self.kernel, self.model) if s]
        roots = [module_root("harness"), *(module_root(s.partition(":")[0]) for s in specs)]
        return os.pathsep.join(_unique(r for r in roots if r))


def _pairs(*pairs: tuple[str, str | None]) -> list[str]:
    return [part for name, value in pairs if value is not None for part in (name, value)]


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
