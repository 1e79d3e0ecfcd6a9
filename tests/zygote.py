"""A preloaded interpreter that forks the Python programs the tests start, so that each does not
import torch, FSDP2, DTensor, hypothesis and pytest again.

Most of this suite's claims are about what a gate session *concludes*: its verdicts, its report,
its exit status. Each such claim starts ``python -m pytest …`` or ``python -m harness.matrix …``,
and on the 2-core CI machine a fresh interpreter spends about 3 of its 4 CPU-seconds of start-up
importing the same third-party modules, well over a hundred times a run. Here one server imports
them once (``PRELOAD``: third-party modules only, never muongate's own, so that a program still
imports muongate from wherever its path says, a wheel's site-packages included) and forks a child
per program. The child becomes what a fresh interpreter would be for that command line: its own
session and process group, the working directory, the environment exactly as given, ``sys.path``
rebuilt from them, ``sys.argv``, standard streams on the caller's files, and at the end what a
fresh interpreter does on its way out (threads joined, ``atexit`` handlers, streams flushed), then
its exit status.

One thing a fork cannot make fresh: ``str`` hashes are salted once per interpreter, so every
program forked from one server iterates a set of strings in the same order, where fresh ones
each draw their own salt. Nothing muongate concludes may depend on that order.

Where fidelity is the claim it stays a fresh interpreter: ``run_python(..., fresh=True)``, and any
environment that differs from the server's in a variable a preloaded module reads at import (only
``PYTHONPATH``, ``HOME``, ``PY_COLORS``, ``PYTEST_*``, ``MUONGATE_*`` and a few more may differ). The plug-in's cost to
other projects, the wheel, torchrun and the standalone reproducers always start afresh.
``tests/test_zygote.py`` holds that a forked program sees what a fresh one sees.

Run as a script it is the server: ``python tests/zygote.py SOCKET``. It never starts a thread,
forks only while it holds the threads a fresh ``import torch`` holds (as
``harness.ranks.forkserver`` does), and leaves when the process that started it is gone.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: what every server imports before it forks: the third-party half of a gate session's start-up.
#: Not hypothesis: pytest marks a plug-in's package for assertion rewriting and warns where it was
#: imported before (``PytestAssertRewriteWarning``), which a fresh session never prints; after
#: torch it costs under 0.1 s.
PRELOAD = (
    "torch",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
    "torch.distributed.tensor.parallel",
    "torch.distributed.checkpoint",
    "numpy",
    "pytest",
    "rich.console",
    "rich.table",
)

#: the variables in which a program's environment may differ from the server's: none of them is
#: read by a preloaded module at import (torch's inductor sets its cache directory in the
#: environment at its first compile, which a test of compiled kernels does in its worker)
_MAY_DIFFER = ("PYTHONPATH", "COLUMNS", "HOME", "USERPROFILE", "PY_COLORS", "TORCHINDUCTOR_CACHE_DIR")
_MAY_DIFFER_PREFIXES = ("PYTEST_", "MUONGATE_")


def _send(sock: socket.socket, obj: Any) -> None:
    data = pickle.dumps(obj)
    sock.sendall(struct.pack("!I", len(data)) + data)


def _recv(sock: socket.socket) -> Any:
    head = _exactly(sock, 4)
    return pickle.loads(_exactly(sock, struct.unpack("!I", head)[0]))


def _exactly(sock: socket.socket, n: int) -> bytes:
    parts = []
    while n:
        part = sock.recv(n)
        if not part:
            raise EOFError("the zygote closed the connection")
        parts.append(part)
        n -= len(part)
    return b"".join(parts)


# -- the server ------------------------------------------------------------------------------


def _base_path() -> list[str]:
    """This interpreter's ``sys.path`` without what its own script directory and ``PYTHONPATH``
    put first: what every program's path ends with (the standard library, site-packages and
    the entries their ``.pth`` files add)."""
    own = {os.path.dirname(os.path.abspath(__file__))}
    own.update(os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)
    return [p for p in sys.path if os.path.abspath(p) not in own]


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _child(request: dict[str, Any], base: list[str]) -> None:
    """Becomes the program ``request`` names; never returns."""
    code = 1
    try:
        os.setsid()
        fds = [os.open(os.devnull, os.O_RDONLY), *(os.open(request[k], os.O_WRONLY) for k in ("stdout", "stderr"))]
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        args: list[str] = request["args"]
        first = os.getcwd() if args[0] == "-m" else os.path.dirname(os.path.abspath(args[0]))
        pythonpath = [os.path.abspath(p) for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [first, *pythonpath, *base]
        import runpy

        import numpy as np

        np.random.seed()  # a fresh interpreter's global generators differ (``random`` reseeds at fork)
        try:
            if args[0] == "-m":
                sys.argv = ["-m", *args[2:]]
                runpy.run_module(args[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(args)
                runpy.run_path(args[0], run_name="__main__")
            code = 0
        except SystemExit as e:
            code = _exit_code(e.code)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        code = _finish(code)
    finally:
        os._exit(code)


def _exit_code(value: Any) -> int:
    """What a fresh interpreter exits with for ``SystemExit(value)``."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


def _finish(code: int) -> int:
    """A fresh interpreter's way out: non-daemon threads joined, ``atexit`` handlers run, the
    standard streams flushed."""
    import atexit
    import threading

    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    except SystemExit as e:
        code = _exit_code(e.code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    return code


def serve(address: str) -> None:
    for name in PRELOAD:
        __import__(name)
    base = _base_path()
    threads = _threads()
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(address)
    listener.listen()
    # A child's exit wakes the loop: SIGCHLD writes to this pipe (no handler runs in between).
    woken, wake = os.pipe()
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    print("ready", flush=True)
    waiting: dict[int, socket.socket] = {}  # child pid: the connection that waits for its status
    while os.getppid() == parent:
        ready, _, _ = select.select([listener, woken], [], [], 1.0)
        if woken in ready:
            os.read(woken, 4096)
        if listener in ready:
            conn, _ = listener.accept()
            request = _recv(conn)
            if _threads() > threads:
                _send(conn, ("refused", f"{_threads()} threads, {threads} after the imports"))
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for fd in (woken, wake):
                    os.close(fd)
                listener.close()
                for other in (conn, *waiting.values()):
                    other.close()
                _child(request, base)
            _send(conn, ("started", pid))
            waiting[pid] = conn
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = waiting.pop(pid)
            with contextlib.suppress(OSError):
                _send(conn, ("exited", os.waitstatus_to_exitcode(status)))
            conn.close()
    for pid in waiting:  # the caller is gone: so are the programs it started
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


# -- the client ------------------------------------------------------------------------------


class Zygote:
    """A server started by this process; ``run`` forks one program from it."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self._dir = tempfile.mkdtemp(prefix="muongate-zygote-")
        self.address = os.path.join(self._dir, "socket")
        self.env = dict(os.environ if env is None else env)
        self.proc = subprocess.Popen(
            [sys.executable, __file__, self.address],
            env=self.env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"the zygote did not start (exit {self.proc.wait()})")

    def takes(self, env: dict[str, str]) -> bool:
        """Whether a program with ``env`` may be forked: it differs from the server's only where
        no preloaded module looks at import."""
        return not self.differs(env)

    def differs(self, env: dict[str, str]) -> list[str]:
        """The variables in which ``env`` differs from the server's where a preloaded module may look."""
        changed = {k for k in env.keys() | self.env.keys() if env.get(k) != self.env.get(k)}
        return sorted(k for k in changed if k not in _MAY_DIFFER and not k.startswith(_MAY_DIFFER_PREFIXES))

    def run(self, args: list[str], cwd: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
        with tempfile.TemporaryDirectory(dir=self._dir) as scratch:
            out, err = Path(scratch, "stdout"), Path(scratch, "stderr")
            out.touch()
            err.touch()
            request = {"args": args, "cwd": cwd, "env": env, "stdout": str(out), "stderr": str(err)}
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(self.address)
                _send(sock, request)
                kind, value = _recv(sock)
                if kind == "refused":
                    raise RuntimeError(f"the zygote refused to fork: {value}")
                pid = value
                deadline = time.monotonic() + timeout
                sock.settimeout(max(0.0, deadline - time.monotonic()))
                try:
                    _, code = _recv(sock)
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
                    raise subprocess.TimeoutExpired(
                        [sys.executable, *args],
                        timeout,
                        out.read_text(errors="replace"),
                        err.read_text(errors="replace"),
                    ) from None
            return subprocess.CompletedProcess(
                [sys.executable, *args], code, out.read_text(errors="replace"), err.read_text(errors="replace")
            )

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        with contextlib.suppress(OSError):
            os.unlink(self.address)
            os.rmdir(self._dir)


if __name__ == "__main__":
    serve(sys.argv[1])
