"""Loads the muongate pytest plugin (everything else lives in harness/plugin), and puts this
repository's own sessions on the gates' ``ci`` profile: its tests draw with hypothesis too, and
the plugin loads a profile only in sessions that collect gates. ``--hypothesis-profile`` and
``MUONGATE_HYPOTHESIS_PROFILE`` still choose another.

The profile is loaded when pytest configures this file, never at its import: a session started
elsewhere that collects this checkout's gates (``--pyargs gates`` from another directory)
imports it during collection, after the user's profile was loaded, and must keep that one."""

import os
from pathlib import Path

import pytest
from hypothesis import settings

from harness.plugin import DEFAULT_PROFILE, register_gate_ci_profile
from harness.plugin.options import PROFILE_VARIABLE

pytest_plugins = ["harness.plugin"]

#: the harness's own tests: none of them is a gate (tests/test_architecture.py holds that)
TESTS = Path(__file__).parent / "tests"


def pytest_configure(config: pytest.Config) -> None:
    register_gate_ci_profile()
    if not config.getoption("hypothesis_profile", None) and not os.environ.get(PROFILE_VARIABLE):
        settings.load_profile(DEFAULT_PROFILE)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The main job (``-m gate``) does not import the harness's own tests, which hold no gate:
    it would import, rewrite and deselect every one of them (2.6 s of CPU in each xdist worker,
    half of a worker's start)."""
    if collection_path == TESTS and config.getoption("markexpr") == "gate":
        return True
    return None
