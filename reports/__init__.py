"""Result records, the stream that holds them, summaries, and their renderings; reads only records."""

from reports.files import write_files
from reports.markdown import to_markdown
from reports.records import SCHEMA, SchemaError
from reports.stream import ResultStream, read_stream, read_streams
from reports.summary import RunSummary, summarize
from reports.terminal import render

__all__ = [
    "SCHEMA",
    "ResultStream",
    "RunSummary",
    "SchemaError",
    "read_stream",
    "read_streams",
    "render",
    "summarize",
    "to_markdown",
    "write_files",
]
