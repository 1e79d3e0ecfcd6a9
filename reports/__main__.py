"""Stored runs, from the command line.

    python -m reports DIR               re-render DIR/results.jsonl (terminal, HTML, Markdown)
    python -m reports compare BASE NOW  what moved between two runs (report directories, streams
                                        or figures.json files)

Exit status 1 when the run has failures (render) or regressed against the baseline (compare).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from reports.diff import diff_runs, render_diff
from reports.files import from_figures, write_files
from reports.records import Record, SchemaError
from reports.stream import read_streams
from reports.summary import RunSummary, summarize
from reports.terminal import render


def _summary(where: str) -> RunSummary:
    """A stored run: a report directory, a results stream, or a ``figures.json``."""
    if where.endswith(".json") and Path(where).is_file():
        return from_figures(json.loads(Path(where).read_text(encoding="utf-8")))
    return summarize(_records(where))


def _records(where: str) -> list[Record]:
    path = Path(where)
    streams = sorted(path.glob("results*.jsonl")) if path.is_dir() else [path]
    if not streams:
        raise SystemExit(f"{where}: no results*.jsonl here")
    try:
        return read_streams(streams)
    except SchemaError as e:
        raise SystemExit(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reports", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("paths", nargs="+", metavar="DIR | compare BASE NOW")
    args = parser.parse_args(argv)
    # as the pytest summary: a terminal's width (the summary fits 100 columns), else as wide as the tables
    console = Console(width=Console().width if Console().is_terminal else 140, emoji=False)
    if args.paths[0] == "compare":
        if len(args.paths) != 3:
            parser.error("compare takes two runs: python -m reports compare BASE NOW")
        diff = diff_runs(_summary(args.paths[1]), _summary(args.paths[2]))
        console.print(render_diff(diff))
        return 1 if diff.regressed else 0
    if len(args.paths) != 1:
        parser.error("give one report directory, or: compare BASE NOW")
    records = _records(args.paths[0])
    summary = summarize(records)
    console.print(render(summary))
    directory = Path(args.paths[0])
    write_files(summary, directory if directory.is_dir() else directory.parent)
    return 1 if summary.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
