"""What the tests that start programs of their own share: where this checkout is, and how
those programs reach it."""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from html.parser import HTMLParser
from pathlib import Path

import pytest
from zygote import Zygote

#: this checkout: the programs a test starts import muongate from here
REPO = Path(__file__).resolve().parents[1]

#: what a test that needs DeepSpeed says where it is not installed
ENGINES = "the engines extra, without a torch of its own: pip install --no-deps -r examples/engines-no-deps.txt"


def run_python(
    *args: str | Path,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    timeout: float,
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``python ARGS…`` (``-m MODULE …`` or a script), its output captured as text, as
    ``subprocess.run`` would run it; forked from this worker's zygote (``tests/zygote.py``)
    unless ``fresh``, unless ``env`` differs where a preloaded module looks, and unless
    ``MUONGATE_TESTS_FRESH=1`` starts every program afresh."""
    argv = [str(a) for a in args]
    env = dict(os.environ if env is None else env)
    cwd = str(cwd if cwd is not None else os.getcwd())
    if not fresh and os.environ.get("MUONGATE_TESTS_FRESH") != "1":
        server = zygote()
        if server.takes(env):
            return server.run(argv, cwd, env, timeout)
    # A session of its own, so that a timeout kills all the program started, as the zygote's does.
    with subprocess.Popen(
        [sys.executable, *argv], cwd=cwd, env=env, text=True, start_new_session=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    ) as proc:  # fmt: skip
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(proc.args, timeout, out, err) from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def torchrun(nproc: int) -> list[str]:
    """``python -m torch.distributed.run`` with ``nproc`` ranks on this node, before a program and its
    arguments. The ranks run without torchrun's ``-u`` (``--no-python`` and this interpreter), so a
    flushed print is one write and two ranks' lines do not interleave; under ``-u`` its text and
    its newline are two. So is it under ``PYTHONUNBUFFERED``: run them with ``buffered(env)``."""
    return [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "--no-python",
        sys.executable,
    ]


def buffered(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without ``PYTHONUNBUFFERED``, for ranks whose lines a test reads: under it a flushed
    print's text and newline are two writes, and two ranks' lines interleave (CI on 2026-12-07:
    "rank 0: … from one device 0rank 1: …", on a machine that sets it)."""
    return {k: v for k, v in env.items() if k != "PYTHONUNBUFFERED"}


def run_pytest(pytester: pytest.Pytester, *args: str, timeout: float) -> pytest.RunResult:
    """``pytester.runpytest_subprocess(*args)`` through ``run_python``: a pytest session of its
    own, in pytester's directory and environment, with a base temporary directory of its own."""
    basetemp = pytester.path / f"runpytest-{len(list(pytester.path.glob('runpytest-*')))}"
    start = time.monotonic()
    run = run_python("-m", "pytest", f"--basetemp={basetemp}", *args, cwd=pytester.path, timeout=timeout)
    return pytest.RunResult(run.returncode, run.stdout.splitlines(), run.stderr.splitlines(), time.monotonic() - start)


#: this process's environment before any test changed it: the zygote's
_ENV = dict(os.environ)


@functools.cache
def zygote() -> Zygote:
    """This process's zygote, started at its first use (in the environment this process started
    with, whatever the test that first uses it has set) and stopped when this process exits."""
    server = Zygote(_ENV)
    atexit.register(server.close)
    return server


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


def _chromium(profile: Path) -> list[str]:
    """Headless Chromium's command line, without the page. Skips where Chromium is missing,
    except under ``CI``, where ``.ci/run`` installs it."""
    found = shutil.which("chromium")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed: .ci/run installs Debian's chromium package")
        pytest.skip("needs Debian's chromium package (apt-get install chromium)")
    # Headless, no network, a fresh profile: as the probe of this machine kind starts it.
    return [found, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile}"]  # fmt: skip


def open_in_chromium(page: Path, profile: Path) -> tuple[list[str], bytes]:
    """``page`` opened in headless Chromium (Debian's package), as a reader would open it: the
    text of every element of its rendered DOM, and a PNG screenshot. Skips where Chromium is
    missing, except under ``CI``, where ``.ci/run`` installs it."""
    flags = _chromium(profile)
    url = page.as_uri()
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120, check=True).stdout
    shot = profile.parent / f"{page.stem}.png"
    subprocess.run(
        [*flags, "--window-size=1280,2000", f"--screenshot={shot}", url], capture_output=True, timeout=120, check=True
    )
    texts = PageTexts()
    texts.feed(dom)
    return texts.texts, shot.read_bytes()


def table_widths_in_chromium(page: Path, profile: Path, window: int) -> tuple[int, int]:
    """The first table of ``page`` in headless Chromium in a window ``window`` px wide: the width
    its content takes and the width its box has (a table wider than its box scrolls). A copy of
    the page measures itself, its script writing the two into the DOM that Chromium dumps."""
    measured = profile.parent / f"{page.stem}-measured.html"
    script = (
        '<script>const t = document.querySelector("table");'
        'document.body.dataset.widths = t.scrollWidth + " " + t.clientWidth;</script></body>'
    )
    measured.write_text(page.read_text(encoding="utf-8").replace("</body>", script), encoding="utf-8")
    dom = subprocess.run(
        [*_chromium(profile), f"--window-size={window},1200", "--dump-dom", measured.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    found = re.search(r'data-widths="(\d+) (\d+)"', dom)
    assert found is not None, f"the page did not measure itself: {dom[-500:]}"
    return int(found[1]), int(found[2])
