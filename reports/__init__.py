"""Results stream, summaries and rendering; reads only plain result records."""

from reports.stream import ResultStream, read_stream, read_streams
from reports.summary import RunSummary, render, summarize, to_markdown, write_files

__all__ = [
    "ResultStream",
    "RunSummary",
    "read_stream",
    "read_streams",
    "render",
    "summarize",
    "to_markdown",
    "write_files",
]
