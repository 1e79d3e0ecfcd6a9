"""mkdocs hooks: the site shows the code's own words. ``{{ docstring("path/to/module.py") }}``
becomes that module's docstring (read with ``ast``, nothing imported), and
``{{ include("FILE.md") }}`` a file of the repository, so that the candidate contract, the
references' conventions, the changelog and CONTRIBUTING are written once; and
``{{ matrix("FILE.json") }}`` the compatibility matrix's grid that ``python -m harness.matrix``
wrote as that file (``reports.matrix.render_grid``), so that the page shows the run's own cells."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
_MARKER = re.compile(r"\{\{ (docstring|include|matrix)\(\"([^\"]+)\"\) \}\}")


def _docstring(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    if not doc:
        raise ValueError(f"{path} has no module docstring")
    return as_markdown(doc)


def _indented_block(lines: list[str], start: int) -> tuple[list[str], int]:
    """The lines from ``start`` indented by four spaces or more (blank lines inside kept), dedented;
    and the index of the first line after them."""
    block: list[str] = []
    j = start
    while j < len(lines):
        inside = lines[j].startswith("    ")
        blank_inside = not lines[j].strip() and j + 1 < len(lines) and lines[j + 1].startswith("    ")
        if not (inside or blank_inside):
            break
        block.append(lines[j][4:])
        j += 1
    return block, j


def as_markdown(doc: str) -> str:
    """A docstring in the house style as Markdown: ````code```` as ``code``, a paragraph ending in
    ``::`` and its indented block as that code, and a term followed by an indented block as a
    definition (the ``def_list`` extension)."""
    lines = doc.replace("``", "`").splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        block, after = _indented_block(lines, i + 1)
        if block and line.rstrip().endswith("::"):
            out += [line.rstrip()[:-1], "", "```python", *block, "```", ""]
            i = after
        elif block and line.strip() and not line.startswith(" ") and not line.startswith(("* ", "- ")):
            out += ["", line, ":   " + "\n    ".join(block).strip(), ""]
            i = after
        else:
            out.append(line)
            i += 1
    return "\n".join(out) + "\n"


def _include(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    # links between the repository's top-level Markdown files point at their pages here, and
    # their links into the site's pages (``docs/pages/X.md``) at those pages
    text = re.sub(r"\(([A-Z]+)\.md\)", lambda m: f"({m.group(1).lower()}.md)", text)
    return text.replace("](docs/pages/", "](")


def matrix_grid(path: Path) -> str:
    """The grid of the matrix ``harness.matrix`` wrote as ``path`` (its ``matrix.json``), as one
    block of HTML between blank lines (Markdown passes it through)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from reports.matrix import Matrix, render_grid

    # each grid's lines get ids of their own: a page may hold several
    anchors = "m-" + re.sub(r"[^A-Za-z0-9]+", "-", path.stem) + "-"
    return "\n" + render_grid(Matrix.from_json(path.read_text(encoding="utf-8")), anchors=anchors) + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def replace(match: re.Match[str]) -> str:
        path = REPO / match.group(2)
        if not path.is_file():
            raise FileNotFoundError(f"{page.file.src_path}: {match.group(0)} names no file {path}")
        if match.group(1) == "matrix":
            return matrix_grid(path)
        return _docstring(path) if match.group(1) == "docstring" else _include(path)

    return _MARKER.sub(replace, markdown)
