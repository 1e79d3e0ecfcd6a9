"""Loads the muongate pytest plugin (everything else lives in harness/plugin), and puts this
repository's own sessions on the gates' ``ci`` profile: its tests draw with hypothesis too, and
the plugin loads a profile only in sessions that collect gates. ``--hypothesis-profile`` and
``MUONGATE_HYPOTHESIS_PROFILE`` still choose another."""

from hypothesis import settings

from harness.plugin import DEFAULT_PROFILE, register_gate_ci_profile

pytest_plugins = ["harness.plugin"]

register_gate_ci_profile()
settings.load_profile(DEFAULT_PROFILE)
