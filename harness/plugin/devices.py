"""Where a session's ranks run: the pool's devices and backend (``--gate-device``, ``--gate-comm``),
torchrun's rank, and pytest-xdist's workers, each of which runs a pool of its own. One room: the
session asks it once, at resolve (``GateSession.resolve``).
"""

from __future__ import annotations

import os
from typing import Any

import pytest


def launched_by_torchrun() -> bool:
    # Without RANK in the environment there is no torchrun, and no need to import the rank code.
    if "RANK" not in os.environ:
        return False
    from harness.ranks import launched_by_torchrun as launched

    return launched()


def resolve_device(config: pytest.Config, nproc: int) -> tuple[str, list[str]]:
    """The backend and one device per rank (under torchrun: this rank's device only)."""
    import torch

    from harness.ranks.relay import BACKEND as RELAY
    from harness.ranks.relay import missing

    wanted, comm = config.getoption("gate_device"), config.getoption("gate_comm")
    if launched_by_torchrun():
        if comm == "relay":
            raise pytest.UsageError("--gate-comm relay runs in muongate's pool: leave it out under torchrun")
        local = int(os.environ["LOCAL_RANK"])
        if wanted != "cpu" and torch.cuda.device_count() > local:
            return "nccl", [f"cuda:{local}"]
        if wanted == "cuda":
            raise pytest.UsageError(f"--gate-device cuda: local rank {local} has no GPU of its own")
        return "gloo", ["cpu"]
    # Under pytest-xdist each worker runs its own pool on its own block of GPUs.
    workers, index = xdist_workers(config)
    gpus = torch.cuda.device_count() if wanted != "cpu" else 0
    if wanted == "cuda" and gpus == 0:
        raise pytest.UsageError("--gate-device cuda: no GPU is visible; try --gate-device cpu")
    on_gpus = wanted == "cuda" or (wanted == "auto" and gpus >= nproc * workers)
    relayed = comm == "relay" or (on_gpus and comm == "auto" and gpus < nproc * workers)
    if relayed and (lacking := missing()):
        raise pytest.UsageError(f"the relay (ranks sharing a GPU, --gate-comm relay): {lacking}")
    if on_gpus and relayed:
        # Ranks share the GPUs, each worker's pool all of them: NCCL cannot, the relay can.
        return RELAY, [f"cuda:{(index * nproc + r) % gpus}" for r in range(nproc)]
    if on_gpus and gpus < nproc * workers:
        raise pytest.UsageError(
            f"--gate-device cuda --gate-comm native needs one GPU per rank: -n {workers} --nproc {nproc} but "
            f"{gpus} GPU(s) are visible; leave out --gate-comm to share them through the relay, or try "
            "--gate-device cpu"
        )
    if on_gpus:
        return "nccl", [f"cuda:{index * nproc + r}" for r in range(nproc)]
    return (RELAY if comm == "relay" else "gloo"), ["cpu"] * nproc


def workerinput(config: pytest.Config) -> dict[str, Any] | None:
    """What xdist hands a worker's own config (``workerid``, ``workercount``); None in a
    controller or without xdist. Never ``PYTEST_XDIST_WORKER``: a pytest session that an xdist
    worker's test starts inherits that variable, and is no worker."""
    return getattr(config, "workerinput", None)


def xdist_worker(config: pytest.Config) -> str | None:
    """This xdist worker's id (``gw0`` …); None in a controller or without xdist."""
    given = workerinput(config)
    return str(given["workerid"]) if given else None


def xdist_workers(config: pytest.Config) -> tuple[int, int]:
    """(number of xdist workers, this worker's index); (1, 0) without xdist."""
    given = workerinput(config)
    if given:
        return int(given["workercount"]), int(str(given["workerid"]).removeprefix("gw"))
    count = getattr(config.option, "numprocesses", None)
    return (count if isinstance(count, int) and count > 0 else 1), 0


def is_xdist_controller(config: pytest.Config) -> bool:
    return xdist_workers(config)[0] > 1 and not xdist_worker(config)
