"""Claims about the documentation site (``docs/``): it builds strictly (a broken link, a missing
page or a docstring marker that names no file fails the build), every link between its pages
lands on a page, the code's own docstrings are on it, and its pages render in headless
Chromium. Needs the ``docs`` extra; CI installs it."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from support import REPO, open_in_chromium


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        import material  # noqa: F401
        import mkdocs  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("the docs extra is not installed: .ci/run installs it (pip install -e '.[docs]')")
        pytest.skip("needs the docs extra: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "docs" / "mkdocs.yml"), "-d", str(out)],
        capture_output=True, text=True, timeout=300, check=False, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return out


def test_every_link_between_the_sites_pages_lands_on_a_page(site: Path) -> None:
    pages = sorted(site.rglob("index.html"))
    assert len(pages) >= 20, pages
    for page in pages:
        for href in re.findall(r'href="([^"#]+)(?:#[^"]*)?"', page.read_text(encoding="utf-8")):
            if urlparse(href).scheme or href.startswith(("mailto:", "data:")):
                continue
            target = (page.parent / href).resolve()
            if target.is_dir():
                target = target / "index.html"
            assert target.is_file(), f"{page.relative_to(site)} links to {href}, which is not in the site"


def test_the_candidate_contract_on_the_site_is_the_declarations_docstring(site: Path) -> None:
    page = (site / "candidates" / "index.html").read_text(encoding="utf-8")
    from harness.candidates import declaration

    first = (declaration.__doc__ or "").strip().splitlines()[0]
    assert first in page, first


def test_the_front_page_and_the_contract_render_in_headless_chromium(site: Path, tmp_path: Path) -> None:
    """The walk a new user takes: the front page links the contract, which renders with its fields."""
    texts, shot = open_in_chromium(site / "index.html", tmp_path / "profile")
    assert "The candidate contract" in texts and "Getting started" in texts, texts[:40]
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 20_000, "the front page rendered blank"
    texts, shot = open_in_chromium(site / "candidates" / "index.html", tmp_path / "profile2")
    assert any("single_device" in t for t in texts) and any("thresholds" in t for t in texts), texts[:40]
    assert len(shot) > 20_000, "the contract page rendered blank"


class _Recorded:
    """What ``add_options`` adds, recorded in place of pytest's parser."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def getgroup(self, *args: Any, **kwargs: Any) -> _Recorded:
        return self

    def addoption(self, *names: str, **kwargs: Any) -> None:
        self.names.extend(n for n in names if n.startswith("--"))


def test_the_options_page_lists_every_option_the_plugin_defines_as_it_is_written() -> None:
    from harness.plugin.options import add_options

    recorded = _Recorded()
    add_options(recorded)  # type: ignore[arg-type]  # it only adds options
    page = (REPO / "docs" / "pages" / "options.md").read_text(encoding="utf-8")
    assert {"--nproc", "--impl", "--gate-report"} <= set(recorded.names), recorded.names
    missing = [name for name in recorded.names if not re.search(rf"`{re.escape(name)}[ =`]", page)]
    assert not missing, f"docs/pages/options.md does not list {missing}"
    # pytest takes the DIR of ``--gate-report DIR`` for a test path when it chooses its rootdir
    assert "| `--gate-report DIR` |" not in page and "| `--gate-report=DIR` |" in page


def test_no_code_on_the_site_shows_a_backslash_before_a_pipe(site: Path) -> None:
    """A table's ``\\|`` is a pipe in its text and a backslash and a pipe inside a code span
    (``--gate-device auto\\|cpu\\|cuda`` read so on the options page)."""
    shown = [
        f"{page.relative_to(site)}: {code}"
        for page in sorted(site.rglob("index.html"))
        for code in re.findall(r"<code>([^<]*\\\|[^<]*)</code>", page.read_text(encoding="utf-8"))
    ]
    assert not shown, shown


def test_the_options_table_sends_the_reader_to_a_page_not_above_or_below() -> None:
    """Its rows came from the README, where "(above)" and "(below)" were sections of the same
    page; on the options page there are none such."""
    rows = [
        line for line in (REPO / "docs" / "pages" / "options.md").read_text().splitlines() if line.startswith("| `-")
    ]
    assert len(rows) >= 15, rows
    stale = [row.split(" |")[0] for row in rows if re.search(r"\((above|below)\)", row)]
    assert not stale, stale


def _bash_blocks(page: str) -> list[str]:
    text = (REPO / "docs" / "pages" / page).read_text(encoding="utf-8")
    return re.findall(r"^```bash\n(.*?)^```$", text, re.M | re.S)


def test_the_getting_started_commands_fit_the_page_and_paste_as_one_command_each() -> None:
    """Each line fits the code box of a 1280 px window (the site neither wraps nor shows all of a
    longer one), and the lines, continued with a backslash, are the one command they were."""
    blocks = _bash_blocks("getting-started.md")
    assert len(blocks) == 2, blocks
    for block in blocks:
        assert max(map(len, block.splitlines())) <= 80, block
        joined = block.replace("\\\n", " ")
        assert len(joined.strip().splitlines()) == 1, block
        parsed = subprocess.run(["bash", "-n", "-c", joined], capture_output=True, text=True, check=False)
        assert parsed.returncode == 0, parsed.stderr
        assert shlex.split(joined)[:3] == ["python3", "-m", "venv"] and "&&" in shlex.split(joined), joined


def test_the_matrix_page_shows_the_grid_its_last_run_wrote(site: Path) -> None:
    """The page's grid is drawn at build time from the ``matrix.json`` that ``python -m harness.matrix``
    wrote (a marker, ``docs/hooks.py``), so it cannot drift from the run: the file names the run that
    wrote it (command, commit, date, machine), reads back as written, and every cell is on the page."""
    from reports.matrix import Matrix

    named = re.findall(r'\{\{ matrix\("([^"]+)"\) \}\}', (REPO / "docs/pages/matrix.md").read_text(encoding="utf-8"))
    assert named, "docs/pages/matrix.md draws no grid"
    page = (site / "matrix" / "index.html").read_text(encoding="utf-8")
    for path in named:
        text = (REPO / path).read_text(encoding="utf-8")
        matrix = Matrix.from_json(text)
        assert matrix.to_json() == text, f"{path} is not as harness.matrix writes it"
        assert matrix.run["command"].startswith("python -m harness.matrix "), matrix.run
        assert matrix.run["commit"] and matrix.run["date"] and matrix.run["machine"], matrix.run
        cells = sum(len(matrix.table(kind)[1]) * (len(matrix.table(kind)[0]) - 3) for kind in matrix.kinds())
        assert page.count('<td class="cell ') >= cells > 0
        for row in matrix.rows:  # a row that ran names the commit it ran at (one that did not import, nothing)
            assert row.spec in page and (row.commit or not row.torch), row.spec
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})  # each grid's lines link to its own
