"""Loads the muongate pytest plugin; everything else lives in harness/plugin.py."""

pytest_plugins = ["harness.plugin"]
