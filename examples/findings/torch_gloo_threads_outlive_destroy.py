"""After ``fully_shard`` on a gloo group, ``destroy_process_group`` leaves the group's threads
running, and a job can then abort at its very end (torch 2.13, gloo).

Run: ``python examples/findings/torch_gloo_threads_outlive_destroy.py`` (only torch; two ranks of
each job are spawned; exits 1 while the finding holds, 0 once it is gone).

A plain gloo job that gathers, then destroys its group, is left with the interpreter's thread
alone: ``~ProcessGroupGloo`` joined gloo's three (``gloo_tcp_loop`` and two
``pt_gloo_runloop``). The same job that first lays a two-layer model out with ``fully_shard``
is left with gloo's three, even after the model and its mesh are gone and the garbage is
collected: something outside Python's objects (no Python container refers to the
group) keeps the mesh's group alive, so its threads live on into the interpreter's teardown.

The harm, seen in ``examples/capture_job.py`` (``torchrun``, 2 ranks, 3 of 80 runs on a
2-core machine beside two CPU burners, and in CI; 0 of 80 once it left with ``os._exit``): a ``pt_gloo_runloop`` thread frees the last
collective it finished (a barrier holding the all-gather before it) after the main thread has
gone into ``Py_FinalizeEx``; freeing a tensor that has a Python object takes the GIL, the
finalizing interpreter ends the thread with ``pthread_exit``, whose unwinding through a
``noexcept`` destructor calls ``std::terminate``: "terminate called without an active
exception", SIGABRT, after every line of the job's work was done (the core's backtrace:
``take_gil`` ← ``ConcretePyInterpreterVTable::decref`` ← ``~AsyncAllgatherWork`` ←
``~AsyncBarrierWork`` ← ``ProcessGroupGloo::runLoop``). A barrier before
``destroy_process_group`` narrows the window but does not close it. muongate's own ranks and
its torchrun examples leave with ``os._exit`` once their output is flushed, as this file's ranks do.
"""

import gc
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

WORLD = 2


def _gloo_threads() -> list[str]:
    tasks = Path("/proc/self/task")
    names = ((tasks / t / "comm").read_text().strip() for t in os.listdir(tasks))
    return sorted(n for n in names if n.startswith(("gloo", "pt_gloo")))


def _rank(rank: int, port: int, shard: bool, left: "mp.SimpleQueue[tuple[int, list[str]]]") -> None:
    """One rank of a job that gathers and tears its group down, after ``fully_shard`` or not."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    if shard:
        model = nn.Sequential(nn.Linear(10, 8), nn.ReLU(), nn.Linear(8, 3))
        fully_shard(model, mesh=init_device_mesh("cpu", (WORLD,)))
        model(torch.randn(4, 10)).sum().backward()
        del model
    pieces = [torch.zeros(2) for _ in range(WORLD)]
    dist.all_gather(pieces, torch.ones(2))
    dist.barrier()
    dist.destroy_process_group()
    gc.collect()
    left.put((rank, _gloo_threads()))
    sys.stdout.flush()
    os._exit(0)  # leave without the interpreter's teardown, where the finding aborts a job


def _job(shard: bool) -> list[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    left: mp.SimpleQueue[tuple[int, list[str]]] = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_rank, args=(port, shard, left), nprocs=WORLD, start_method="spawn")
    return dict(left.get() for _ in range(WORLD))[0]


def main() -> int:
    if sys.platform != "linux":
        print("reads /proc/self/task: Linux only")
        return 2
    plain, sharded = _job(shard=False), _job(shard=True)
    print(f"gloo threads left after destroy_process_group: a plain job {plain}; after fully_shard {sharded}")
    return 1 if sharded and not plain else 0


if __name__ == "__main__":
    sys.exit(main())
