from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from support import pythonpath

pytest_plugins = ["pytester"]


@pytest.fixture(scope="session", autouse=True)
def _torch_before_any_pytester() -> None:
    """torch, imported before the first pytester snapshot of this process, so that it is in
    every snapshot. pytester's in-process sessions take away, when they end, every module they
    imported; torch cannot be imported a second time in one process ("SystemError: ... bad call
    flags", then a segmentation fault), so a later in-process session that imported it again
    failed (tests/test_plugin.py run in one process failed so on d7f4a17). So must the parts of
    torch that register operators when first imported (FSDP2 imports
    ``torch.distributed._symmetric_memory``, whose second import is "Only a single TORCH_LIBRARY
    can be used to register the namespace symm_mem"): tests/test_plugin.py,
    test_judging_candidates.py, test_impl_plugins.py and test_reports.py on two workers failed
    so, 1 to 3 tests a run, at 35c45b3. A session fixture, not an import of this file: pytest
    loads this file wherever ``tests`` is a test path, the main job (``-m gate``) included,
    which collects none of these tests and has no use for ``torch._dynamo``."""
    import torch._dynamo
    import torch.distributed.checkpoint
    import torch.distributed.fsdp
    import torch.distributed.tensor  # noqa: F401


_REPRODUCE = re.compile(r"^reproduce: (PYTHONPATH=.*)$", re.MULTILINE)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked ``slow`` first, each group in its own order: xdist hands tests out in
    collection order, and a long test that starts last keeps the other workers idle while it
    runs (a sort, not a dependency: the suite passes in random order too)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def other_project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """pytester's directory as another project's: the sessions it starts import its own
    modules first, then muongate from this checkout."""
    monkeypatch.setenv("PYTHONPATH", pythonpath(pytester.path))
    return pytester


@pytest.fixture
def rerun_reproduce(tmp_path: Path) -> Callable[[str], subprocess.CompletedProcess[str]]:
    """Runs the last ``reproduce:`` command of a failing run's output from an empty scratch
    directory, as a user who copied it would (this interpreter stands for ``python``)."""

    def run(output: str) -> subprocess.CompletedProcess[str]:
        commands = _REPRODUCE.findall(output)
        assert commands, f"no reproduce command in:\n{output[-3000:]}"
        scratch = tmp_path / "scratch"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        command = commands[-1].replace(" python -m pytest ", f" {sys.executable} -m pytest ", 1)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        return subprocess.run(
            command, shell=True, cwd=scratch, env=env, capture_output=True, text=True, timeout=600, check=False
        )

    return run
