"""The gates' hypothesis profiles, and which one a session of gates runs under.

Profiles are only registered here; a session that runs gates loads one (``choose``).
Distributed cases take milliseconds to seconds, so hypothesis's per-example deadline is off;
the pool's own deadline bounds each case. ``ci`` is derandomized so CI runs are repeatable.
No explain phase: it re-runs a failing case about a hundred times more to annotate
hypothesis's drawn case (30.6 s of a 43 s cause-gate session that found a bug), and the
report prints the case as it ran with the fields that differ from the defaults;
``--hypothesis-explain`` brings it back.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, settings

from harness.plugin.devices import launched_by_torchrun
from harness.plugin.options import PROFILE_VARIABLE

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


def choose(config: pytest.Config) -> None:
    """Loads the gates' hypothesis profile, unless the user chose one: ``--hypothesis-profile``
    (hypothesis's plugin loads it), ``MUONGATE_HYPOTHESIS_PROFILE``, or one their conftest
    loaded; else ``ci``. Under torchrun, every rank draws the same examples in the same order."""
    current = settings.get_current_profile_name()
    register_gate_ci_profile()  # where hypothesis had loaded its own ci (a CI machine), ours replaces it
    if config.getoption("hypothesis_profile", None):
        pass
    elif os.environ.get(PROFILE_VARIABLE):
        _load(os.environ[PROFILE_VARIABLE])
    elif current in ("default", DEFAULT_PROFILE) or current.startswith("default-with-"):
        _load(DEFAULT_PROFILE)
    _fix_seed(config)
    if launched_by_torchrun():
        # No randomness, no database.
        settings.register_profile("torchrun", settings.default, derandomize=True, database=None)
        settings.load_profile("torchrun")


def _load(name: str) -> None:
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
