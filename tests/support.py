"""What the tests that start programs of their own share: where this checkout is, and how
those programs reach it."""

from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

#: this checkout: the programs a test starts import muongate from here
REPO = Path(__file__).resolve().parents[1]

#: what a test that needs DeepSpeed says where it is not installed
ENGINES = "the engines extra, without a torch of its own: pip install --no-deps -r examples/engines-no-deps.txt"


def pythonpath(*first: Path | str) -> str:
    """``FIRST…``, then this checkout, then the caller's own ``PYTHONPATH``."""
    inherited = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join([*map(str, first), str(REPO), *([inherited] if inherited else [])])


def repo_env(*first: Path | str, **extra: str) -> dict[str, str]:
    """This process's environment, with ``pythonpath(*first)`` and ``extra`` set."""
    return {**os.environ, "PYTHONPATH": pythonpath(*first), **extra}


class PageTexts(HTMLParser):
    """The text of every element of a rendered page, one string per element."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def handle_data(self, data: str) -> None:
        if data.strip():
            self.texts.append(data.strip())


def open_in_chromium(page: Path, profile: Path) -> tuple[list[str], bytes]:
    """``page`` opened in headless Chromium (Debian's package), as a reader would open it: the
    text of every element of its rendered DOM, and a PNG screenshot. Skips where Chromium is
    missing, except under ``CI``, where ``.ci/run`` installs it."""
    found = shutil.which("chromium")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed: .ci/run installs Debian's chromium package")
        pytest.skip("needs Debian's chromium package (apt-get install chromium)")
    # Headless, no network, a fresh profile: as the probe of this machine kind starts it.
    flags = [found, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}"]  # fmt: skip
    url = page.as_uri()
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120, check=True).stdout
    shot = profile.parent / f"{page.stem}.png"
    subprocess.run(
        [*flags, "--window-size=1280,2000", f"--screenshot={shot}", url], capture_output=True, timeout=120, check=True
    )
    texts = PageTexts()
    texts.feed(dom)
    return texts.texts, shot.read_bytes()
