"""``python -m reports DIR``: re-renders a stored run (its ``results.jsonl``) in the terminal and as files."""

from __future__ import annotations

import argparse
import os

from rich.console import Console

from reports.stream import read_stream
from reports.summary import render, summarize, write_files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reports", description=__doc__)
    parser.add_argument("directory", help="a report directory holding results.jsonl")
    args = parser.parse_args(argv)
    summary = summarize(read_stream(os.path.join(args.directory, "results.jsonl")))
    Console().print(render(summary))
    write_files(summary, args.directory)
    return 1 if summary.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
