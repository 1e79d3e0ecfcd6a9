"""Claims about measurements kept between sessions (``harness.verdicts.kept``): a kept figure is served
only for the same function, arguments, code, torch and device; keeping can be switched off;
and a directory that cannot be written costs time, never a verdict."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path
from types import ModuleType

import pytest

from harness.verdicts import kept as kept_module

MEASURED = """
calls = []


def measure(size, device):
    calls.append(size)
    return {"size": size, "inf": float("inf")}
"""

_loads = itertools.count()


def _load(path: Path, source: str) -> ModuleType:
    """A fresh module from ``source`` at ``path``, imported anew each time."""
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"measured_{next(_loads)}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _kept(module: ModuleType) -> ModuleType:
    module.kept_measure = kept_module.kept()(module.measure)
    return module


def test_a_second_session_is_served_what_the_first_measured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUONGATE_CACHE_DIR", str(tmp_path / "cache"))
    first = _kept(_load(tmp_path / "m.py", MEASURED))
    assert first.kept_measure(3, "cpu") == {"size": 3, "inf": float("inf")}
    assert first.kept_measure(3, "cpu") == first.kept_measure(3, "cpu") and first.calls == [3]
    second = _kept(_load(tmp_path / "m.py", MEASURED))  # another session: nothing in memory
    assert second.kept_measure(3, "cpu") == {"size": 3, "inf": float("inf")} and second.calls == []
    assert second.kept_measure(4, "cpu")["size"] == 4 and second.calls == [4]


def test_changed_code_is_measured_afresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUONGATE_CACHE_DIR", str(tmp_path / "cache"))
    _kept(_load(tmp_path / "m.py", MEASURED)).kept_measure(3, "cpu")
    changed = _kept(_load(tmp_path / "m.py", MEASURED.replace('"size": size', '"size": size + 1')))
    assert changed.kept_measure(3, "cpu")["size"] == 4 and changed.calls == [3]


def test_an_empty_cache_directory_switches_keeping_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUONGATE_CACHE_DIR", "")
    assert kept_module.directory() is None
    _kept(_load(tmp_path / "m.py", MEASURED)).kept_measure(3, "cpu")
    again = _kept(_load(tmp_path / "m.py", MEASURED))
    again.kept_measure(3, "cpu")
    assert again.calls == [3]


def test_a_directory_that_cannot_be_written_is_measured_around(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "a file, not a directory"
    blocked.write_text("")
    monkeypatch.setenv("MUONGATE_CACHE_DIR", str(blocked / "cache"))
    module = _kept(_load(tmp_path / "m.py", MEASURED))
    assert module.kept_measure(3, "cpu")["size"] == 3 and module.calls == [3]


def test_the_default_directory_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("MUONGATE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kept_module.directory() == tmp_path / "muongate"
