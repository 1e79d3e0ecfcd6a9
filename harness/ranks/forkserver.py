"""multiprocessing's forkserver, forked from this process instead of started afresh, where that
is safe: the CPU pool's ranks then come from a server that inherited this process's imports.

A forkserver started the usual way is a new interpreter that imports torch, FSDP2, DTensor and
the rank tasks again: about 4 s of CPU and of waiting at the first case of every gate session
on the 2-core machine, which a session has already paid once for its own imports. Forked,
the server imports only what this process lacks, then warms up (``harness.tasks.warmup``, where preloaded) as
before; everything downstream (``Process``, sentinels, exit codes) is multiprocessing's own.

A fork copies every thread's locks but not the threads, so the server is forked only while
this process holds no thread beyond those a fresh ``import torch`` holds (the interpreter's
and OpenBLAS's, which stops its own around a fork; the same as the usual server holds when it
forks a rank): no Python thread but the main one, and no more native threads than when this
module was imported, before any case ran. Otherwise (an xdist worker has execnet's threads;
a process that ran a parallel torch op has OpenMP's) the server starts the usual way. So it
does on a CUDA build of torch: a process forked from one that has touched the CUDA driver
cannot use CUDA, and the CPU ranks' checkpoint writer asks for it where a GPU is present.

The server keeps what it inherited (open files, objects): closing a descriptor a forgotten
object still names would let that object close whatever reuses the number later, in a rank.
It never runs this process's exit handlers (pytest's, which remove its temporary
directories): it leaves with ``os._exit``. Relies on ``multiprocessing.forkserver``'s
internals as of Python 3.11 and 3.12; where they differ, the server starts the usual way.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import multiprocessing.forkserver as mp_forkserver
import os
import socket
import threading
import traceback
import warnings
from multiprocessing import connection, resource_tracker, util
from typing import Any

import torch

#: native threads of this process when it first imported this module (``/proc``; Linux only)
_TASKS = "/proc/self/task"
_THREADS_AT_IMPORT = len(os.listdir(_TASKS)) if os.path.isdir(_TASKS) else None


def safe_to_fork() -> str | None:
    """Why the server may not be forked from this process now, or ``None`` where it may."""
    if _THREADS_AT_IMPORT is None:
        return "no /proc/self/task to count threads in"
    if torch.backends.cuda.is_built():
        return "a CUDA build of torch"
    if threading.active_count() > 1:
        return f"{threading.active_count() - 1} Python threads besides the main one"
    native = len(os.listdir(_TASKS))
    if native > _THREADS_AT_IMPORT:
        return f"{native} native threads, {_THREADS_AT_IMPORT} at import"
    server: Any = mp_forkserver._forkserver
    if not all(hasattr(server, a) for a in ("_lock", "_forkserver_pid", "_forkserver_address", "_forkserver_alive_fd")):
        return "multiprocessing.forkserver's internals are not those of Python 3.11 and 3.12"
    return None


def fork_server(preload: list[str]) -> bool:
    """Starts multiprocessing's forkserver as a fork of this process, importing ``preload`` in
    it, unless one is running or forking is not safe now (``safe_to_fork``). Returns whether
    the server now running was forked from this process."""
    if safe_to_fork() is not None:
        return False
    server: Any = mp_forkserver._forkserver
    if server._forkserver_pid is not None:
        return False
    resource_tracker.ensure_running()
    with socket.socket(socket.AF_UNIX) as listener:
        address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
        listener.bind(address)
        if not util.is_abstract_socket_namespace(address):
            os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        # No lock is held across the fork (the server would inherit it held): this process has
        # one thread, so nothing else starts a server meanwhile.
        with warnings.catch_warnings():
            # Python 3.12 warns of any thread at a fork; OpenBLAS's are the ones allowed above.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the server: it never returns
            code = 1
            try:
                os.close(alive_w)
                os.environ["CUDA_VISIBLE_DEVICES"] = ""
                for name in preload:  # as the usual server does: what does not import, the ranks name
                    with contextlib.suppress(ImportError):
                        importlib.import_module(name)
                # What the ranks inherit is never garbage: their collections need not walk it
                # (nor copy its pages by touching them).
                gc.freeze()
                mp_forkserver.main(listener.fileno(), alive_r, [])
                code = 0
            except SystemExit as e:  # the clients are gone (main's own way out)
                code = e.code if isinstance(e.code, int) else 0
            except BaseException:  # as the usual server's interpreter would, say why before leaving
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(alive_r)
    with server._lock:
        server._forkserver_address = address
        server._forkserver_alive_fd = alive_w
        server._forkserver_pid = pid
    return True
