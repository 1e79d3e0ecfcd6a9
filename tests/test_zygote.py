"""Claims about the tests' zygote (``tests/zygote.py``): a program forked from it is what a fresh
interpreter would be for the same command line, and one past its time is killed with all it started."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from support import REPO, run_python, zygote
from zygote import Zygote

PROBE = """
import atexit, json, os, sys, threading, time

printed = threading.Event()

def late():  # still running when the main thread exits: the interpreter must wait for it
    printed.wait()
    time.sleep(0.2)
    print("the thread finished", flush=True)

threading.Thread(target=late).start()
atexit.register(lambda: print("atexit ran"))
print(json.dumps({
    "argv": sys.argv, "path": sys.path, "cwd": os.getcwd(), "main": __name__,
    "env": {k: v for k, v in os.environ.items() if k.startswith("MUONGATE_PROBE") or k == "PYTHONPATH"},
    "muongate imported": sorted({"harness", "gates", "reference", "reports"} & set(sys.modules)),
}), flush=True)
printed.set()
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[-1]))
"""


def _both(*args: str | Path, **kw: object) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    assert not zygote().differs(dict(kw.get("env") or os.environ))  # type: ignore[arg-type]  # forked, not afresh
    fresh = run_python(*args, fresh=True, timeout=120, **kw)  # type: ignore[arg-type]
    forked = run_python(*args, timeout=120, **kw)  # type: ignore[arg-type]
    return fresh, forked


def test_a_forked_script_sees_the_argv_path_directory_environment_and_exit_of_a_fresh_one(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "lib"), "MUONGATE_PROBE": "1"}
    fresh, forked = _both(tmp_path / "probe.py", "a b", "3", cwd=work, env=env)
    assert fresh.returncode == 3, fresh.stderr
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert "the thread finished" in fresh.stdout and "atexit ran" in fresh.stdout


def test_a_forked_module_run_sees_what_a_fresh_one_sees(tmp_path: Path) -> None:
    (tmp_path / "probe_module.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    fresh, forked = _both("-m", "probe_module", "0", cwd=REPO, env=env)
    assert fresh.returncode == 0, fresh.stderr
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_a_forked_pytest_session_prints_what_a_fresh_one_prints(tmp_path: Path) -> None:
    (tmp_path / "test_probe.py").write_text(
        "import warnings\n\ndef test_passes():\n    warnings.warn('a warning')\n\n"
        "def test_fails():\n    assert [1, 2] == [1, 3]\n"
    )
    fresh, forked = _both("-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", cwd=tmp_path)
    assert fresh.returncode == 1, fresh.stdout

    def timeless(out: str) -> str:
        return re.sub(r" in [\d.]+s", "", out)

    assert timeless(forked.stdout) == timeless(fresh.stdout)
    assert forked.stderr == fresh.stderr


def test_a_program_past_its_timeout_is_killed_with_everything_it_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    (tmp_path / "slow.py").write_text(
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen(['sleep', '600'])\nopen({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    for fresh in (True, False):
        assert fresh or not zygote().differs(dict(os.environ))
        with pytest.raises(subprocess.TimeoutExpired):
            run_python(tmp_path / "slow.py", timeout=5, fresh=fresh)
        _gone(int(pid_file.read_text()))


def _gone(pid: int) -> None:
    """Waits a few seconds for ``pid`` to be gone (or a zombie: killed, its parent gone too)."""
    for _ in range(100):
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return
        except FileNotFoundError:
            return
        time.sleep(0.05)
    pytest.fail(f"the program's child {pid} outlived the timeout")


def test_an_environment_that_differs_where_a_preloaded_module_looks_runs_afresh() -> None:
    server = Zygote()
    try:
        same = dict(server.env)
        assert server.takes({**same, "PYTHONPATH": "/elsewhere", "MUONGATE_CACHE_DIR": "", "PYTEST_ADDOPTS": "-q"})
        assert not server.takes({**same, "OMP_NUM_THREADS": "1"})
        assert not server.takes({**same, "CI": "" if same.get("CI") else "true"})
        assert not server.takes({k: v for k, v in same.items() if k != "PATH"})
    finally:
        server.close()
