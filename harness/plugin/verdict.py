"""The session's verdict, a pytest plug-in of its own (as pytest-xdist registers its terminal
reporter): at the session's end it reads the result streams once, decides the exit status, and
writes the report (the terminal's summary, the files, GitHub's step summary).

A session that named a candidate (``--impl``, ``--engine``) and judged nothing of it fails, and so
does one that left unjudged a part the user named (the ledger's ``Unjudged`` records), unless
``--allow-unjudged``; with ``--gate-baseline``, a regression against the stored figures fails it
too. Which streams are the session's, and which earlier files it cleared, the session says
(``GateSession``, which registers this).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


class Verdict:
    """The exit status and the report of one session of gates (module docstring)."""

    def __init__(
        self,
        config: pytest.Config,
        streams: Callable[[], list[Path]],
        cleared: Callable[[], list[str]],
        skipped: Callable[[], list[tuple[str, str]]],
    ) -> None:
        self.config = config
        #: this session's result streams (its own, or an xdist controller's workers')
        self.streams = streams
        #: the gate tests skipped before any case ran, with why (no stream holds them then)
        self.skipped = skipped
        #: an earlier run's report files the session removed
        self.cleared = cleared
        #: ``--gate-baseline``'s figures, read at once so that a bad file is a usage error
        self.baseline = read_baseline(config)
        #: why a session that named a candidate judged nothing of it ("": it judged some)
        self.unjudged = ""
        #: the run's summary, read from its streams once, at the session's end
        self.summary: Any = None
        self.baseline_diff: Any = None

    @pytest.hookimpl(tryfirst=True)  # as the session's was: the status is decided before others read it
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """A session that named a candidate (``--impl``, ``--engine``) and judged nothing of it fails,
        naming why, unless ``--allow-unjudged``; so does one that left unjudged a part the user named
        (a captured parameter or mesh: the ledger's ``Unjudged`` records); with ``--gate-baseline``, a
        regression against the stored figures fails it too."""
        config = self.config
        named = config.getoption("impl") or config.getoption("engine")
        streams = self.streams()
        if not streams:
            # Every gate selected skipped before its first case: no runner started, nothing was judged.
            skipped = self.skipped()
            if named and skipped:
                self.unjudged = (
                    f"nothing of the candidate was judged: all {len(skipped)} selected gate test(s) skipped "
                    f"before any case ran, e.g. {skipped[0][1]}; no report was written"
                )
                if not config.getoption("allow_unjudged") and session.exitstatus == pytest.ExitCode.OK:
                    session.exitstatus = pytest.ExitCode.TESTS_FAILED
            return
        from reports.stream import read_streams
        from reports.summary import summarize, unjudged_reason

        summary = self.summary = summarize(read_streams(streams))
        why = unjudged_reason(summary) if named else ""
        asked = summary.unjudged_asked
        if asked and not why:  # parts the user named by --layout-from, each listed in the report
            why = f"{len(asked)} part(s) of what you named were not judged, listed above by reason"
        if why:
            self.unjudged = why
            if not config.getoption("allow_unjudged") and session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if self.baseline is None:
            return
        from reports.diff import diff_runs

        self.baseline_diff = diff_runs(self.baseline, summary)
        if self.baseline_diff.regressed and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        streams = self.streams()
        if not streams:
            self._say_unjudged(terminalreporter, config)
            return
        from rich.console import Console

        from reports.diff import render_diff
        from reports.files import write_files
        from reports.markdown import to_markdown
        from reports.stream import read_streams
        from reports.summary import summarize
        from reports.terminal import render

        # Read once, in pytest_sessionfinish, which runs first: the streams can hold thousands of records.
        summary = self.summary or summarize(read_streams(streams))
        console = Console(  # no emoji: "examples.hf_llama:llama" is a spec, not ":llama:"
            file=terminalreporter._tw._file,
            width=terminalreporter._tw.fullwidth if terminalreporter._tw._file.isatty() else 140,  # a log: lines whole
            no_color="CI" in os.environ,
            emoji=False,
        )
        console.print(render(summary), crop=False)  # a reproduce command stays whole, to be copied
        directory = streams[0].parent
        write_files(summary, directory)
        names = ", ".join(p.name for p in streams)
        cleared = self.cleared()
        removed = f" (an earlier run's {', '.join(cleared)} removed)" if cleared else ""
        terminalreporter.write_line(
            f"muongate report: {directory}/equivalence.html, equivalence.md, figures.json, {names}{removed}"
        )
        self._say_unjudged(terminalreporter, config)
        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if step_summary:
            with open(step_summary, "a", encoding="utf-8") as f:
                f.write(to_markdown(summary))
        if self.baseline_diff is not None:
            console.print(render_diff(self.baseline_diff))
            for line in self.baseline_diff.messages():
                terminalreporter.write_line(f"REGRESSION against {config.getoption('gate_baseline')}: {line}", red=True)

    def _say_unjudged(self, terminalreporter: Any, config: pytest.Config) -> None:
        """The NOT JUDGED line, where the session named a candidate and left it unjudged."""
        if not self.unjudged:
            return
        allowed = config.getoption("allow_unjudged")
        terminalreporter.write_line(
            f"muongate: NOT JUDGED: {self.unjudged}"
            + (" (--allow-unjudged)" if allowed else "; --allow-unjudged accepts that"),
            yellow=allowed,
            red=not allowed,
            bold=True,
        )


def read_baseline(config: pytest.Config) -> Any:
    """The ``--gate-baseline`` figures, read now so that a bad file is a usage error, not a late crash."""
    path = config.getoption("gate_baseline")
    if path is None:
        return None
    import json

    from reports.files import from_figures

    try:
        return from_figures(json.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise pytest.UsageError(
            f"--gate-baseline {path}: {e}; expected the figures.json an earlier run wrote to its --gate-report directory"
        ) from e
