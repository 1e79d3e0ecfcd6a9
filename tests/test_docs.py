"""Claims about the documentation site (``docs/``): it builds strictly (a broken link, a missing
page or a docstring marker that names no file fails the build), every link between its pages
lands on a page, the code's own docstrings are on it, and its pages render in headless
Chromium. Needs the ``docs`` extra; CI installs it."""

from __future__ import annotations

import os
import re
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
