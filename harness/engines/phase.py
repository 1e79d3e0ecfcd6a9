"""One engine case on a world size the rank pool does not have (a resharded checkpoint loaded
on 1 or 4 ranks), in processes of its own::

    python -m harness.engines.phase CASE OUT

``CASE`` is a pickled ``EngineCase``. This process imports torch and the engine once, then
forks the case's ranks, which make a gloo group of their own (CPU only). Rank 0 pickles its
comparisons into ``OUT``. A rank that fails exits non-zero with its traceback on stderr, and
the others are stopped. The whole run is bounded by ``--timeout`` seconds (default 300).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import pickle
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

from harness.engines import LoadedEngine


def _rank(rank: int, case: Any, port: int, out: str) -> None:
    import torch.distributed as dist

    from harness.ranks import RankContext
    from harness.tasks.engine import run_engine_case

    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(case.world_size),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    try:
        dist.init_process_group("gloo", rank=rank, world_size=case.world_size)
        context = RankContext(rank, case.world_size, "cpu", "gloo", 0, group=dist.group.WORLD)
        result = run_engine_case(context, case)
        if rank == 0:
            Path(out).write_bytes(pickle.dumps(result.comparisons))
        dist.destroy_process_group()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.engines.phase")
    parser.add_argument("case")
    parser.add_argument("out")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    case = pickle.loads(Path(args.case).read_bytes())
    LoadedEngine.load(case.engine)  # imported once, before the ranks fork
    fork = multiprocessing.get_context("fork")
    port = _free_port()
    ranks = [fork.Process(target=_rank, args=(r, case, port, args.out)) for r in range(case.world_size)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(args.timeout)
    failed = [r for r, p in enumerate(ranks) if p.exitcode != 0]
    for p in ranks:
        if p.is_alive():
            p.kill()
            p.join()
    if failed:
        print(f"{case.describe()}: rank(s) {failed} failed or did not finish in {args.timeout:g} s", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
