"""The muongate pytest plugin: its options, its markers and its two fixtures; everything else,
the hypothesis profiles included, belongs to the session object.

Loaded by the root ``conftest.py`` and exposed as the ``harness.plugin`` ``pytest11`` entry
point, so after ``pip install`` another project's suite has it too (and runs the gates
with ``--pyargs gates``). Options and their checks live in ``options``; the live display
in ``progress``; the session, what it resolves, runs and reports, and its hooks, in
``gate_session.GateSession``, one object per pytest session, which ``pytest_configure``
registers with pytest (``session_of`` finds it).

Because the entry point loads it into every pytest session of an environment where muongate
is installed, the plugin costs nothing where its gates are not collected: importing it only
registers hypothesis profiles, and ``pytest_configure`` only checks option values and makes the
session object, which waits for the first sign that the session runs gates before it imports
torch or loads anything.

What a CI system reads: each gate's figures go into the test's ``user_properties`` (so
``--junitxml`` carries them), and the Markdown report is appended to
``$GITHUB_STEP_SUMMARY`` when that variable is set.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import pytest

from harness.plugin.devices import launched_by_torchrun
from harness.plugin.gate_session import GATES, GateConfig, GateSession
from harness.plugin.options import add_options, check_options
from harness.plugin.profiles import DEFAULT_PROFILE, register_gate_ci_profile

__all__ = [
    "DEFAULT_PROFILE",
    "GATES",
    "GateConfig",
    "GateSession",
    "register_gate_ci_profile",
    "running_config",
    "session_of",
]

#: the session's ``GateSession``, made and registered by ``pytest_configure``
SESSION = pytest.StashKey[GateSession]()


#: the session collecting or running tests in this context (``running_config``): set and reset around
#: them, so that nothing outlives a session and a session pytester starts inside another reads its own
_RUNNING: ContextVar[pytest.Config] = ContextVar("muongate_session")


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """The markers; every option value checked (before hypothesis's own plugin loads a profile);
    the session's object made and registered, which resolves the devices and the plug-ins at once
    where the options or the arguments say that the session runs gates, so that their usage
    errors come before collection (and, under xdist, before any worker starts)."""
    config.addinivalue_line("markers", "gate: a distributed equivalence claim run on the rank pool")
    config.addinivalue_line(
        "markers",
        "judges(what, subject): the test judges WHAT (a part of muongate, a kernel), not the optimizer candidate; "
        "skipped under --impl, and reported as judging SUBJECT",
    )
    config.addinivalue_line(
        "markers",
        "engine: an engine gate (harness.engines): it judges --engine, and runs only under it, where it is the "
        "only kind of gate that runs",
    )
    check_options(config)
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
    session = GateSession(config, 2 if nproc is None else nproc)
    config.stash[SESSION] = session
    config.pluginmanager.register(session, "muongate-session")
    config.pluginmanager.register(session.verdict, "muongate-verdict")
    accept = config.getoption("accept")
    # a room of its own (harness/plugin/accepted.py), registered as pytest-xdist registers its own
    if accept is not None:
        from harness.plugin.accepted import AcceptedError, AcceptedFindings, load_accepted

        try:
            accepted = load_accepted(accept)
        except AcceptedError as e:
            raise pytest.UsageError(f"--accept {e}") from None
        config.pluginmanager.register(AcceptedFindings(accept, accepted, lambda: session.runner), "muongate-accepted")


def session_of(config: pytest.Config) -> GateSession:
    """The ``GateSession`` of ``config``'s pytest session."""
    return config.stash[SESSION]


@contextlib.contextmanager
def _running(config: pytest.Config) -> Iterator[None]:
    """``config``'s session is the current one while the block runs (``running_config``)."""
    token = _RUNNING.set(config)
    try:
        yield
    finally:
        _RUNNING.reset(token)


def running_config() -> pytest.Config:
    """The config of the session that is collecting or running tests here; an error where none is."""
    try:
        return _RUNNING.get()
    except LookupError:
        raise RuntimeError(
            "no muongate session is collecting or running tests here: the session's configuration "
            "(harness.session.gate_config) is read inside a gate (its test, a strategy it draws, pytest_generate_tests)"
        ) from None


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Iterator[None]:
    """The gate modules read the session's configuration (``harness.session``) while they are
    collected (``pytest_generate_tests``)…"""
    with _running(session.config):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """…and while each test is set up, run and torn down."""
    with _running(item.config):
        return (yield)


@pytest.fixture(scope="session")
def gate_runner(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The session's ``GateRunner``: a rank pool plus the results stream."""
    yield from session_of(request.config).start_runner()


@pytest.fixture(scope="session")
def gate_model(request: pytest.FixtureRequest) -> Any:
    """The ``--model`` factory's model as a training spec (``harness.models.plugin.ModelCase``), or ``None``."""
    return session_of(request.config).resolve().model
