"""The harness: rank pool, cases and strategies, tensor construction, comparison, the pytest plugin."""

#: muongate's version, the one place it is written (pyproject.toml reads it; CHANGELOG.md says what each holds).
__version__ = "0.2.0"
