"""The results stream: one record per line (``reports.records``), appended and flushed as each
result arrives, so a run that crashes or is killed keeps every finished record.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from reports.records import Header, Record, decode, dumps


class ResultStream:
    """Appends records to ``path`` (JSON Lines), flushing each and fsyncing on ``sync``.

    With ``path=None`` it writes nothing (ranks other than 0 under torchrun).
    """

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path is not None else None
        self._file: TextIO | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # backslashreplace: a lone surrogate in a string (output decoded with surrogateescape)
            # is written as "\\udcff", JSON's own escape for it, which reads back as the same
            # string, where strict UTF-8 raised and lost the record
            self._file = open(self.path, "w", encoding="utf-8", errors="backslashreplace")  # noqa: SIM115 - closed in close()

    def write(self, record: Record, *, sync: bool = False) -> None:
        if self._file is None:
            return
        self._file.write(dumps(record) + "\n")
        self._file.flush()
        if sync:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _lines(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Every complete JSON line; a line cut short by a crash is skipped."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def read_stream(path: str | os.PathLike[str]) -> Iterator[Record]:
    """The records of one stream; ``reports.records.SchemaError`` if it is not one this reader knows."""
    return decode(_lines(path), source=str(path))


def read_streams(paths: Sequence[str | os.PathLike[str]]) -> list[Record]:
    """The records of several streams of one run (xdist workers' files): the first header only."""
    return [r for i, path in enumerate(paths) for r in read_stream(path) if i == 0 or not isinstance(r, Header)]
