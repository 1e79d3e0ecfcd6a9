"""Probe: can two ranks on one GPU run DTensor and FSDP2 over a gloo process group?

Issue #52, item 4. Two processes (torch.multiprocessing, FileStore) share ``cuda:0``. Each stage
runs in a fresh pair of processes, with a watchdog: a stage that does not return in
``PROBE_WAIT_S`` (20 s), or crashes, writes rank 0's stack (``faulthandler``), which is printed. Standalone, imported by no test; on a machine
without CUDA it says so and exits 0. What it found: docs/pages/torchrun-gpus.md, "Ranks on one GPU".

    python examples/one_gpu_probe.py        # about a minute on one H100
"""

import faulthandler
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WAIT_S = float(os.environ.get("PROBE_WAIT_S", "20"))


def _plain(rank: int) -> None:
    t = torch.full((4,), float(rank + 1), device="cuda:0")
    dist.all_reduce(t)
    world = dist.get_world_size()
    assert t[0].item() == world * (world + 1) / 2, t


def _funcol(rank: int, device: str = "cuda:0") -> None:
    import torch.distributed._functional_collectives as funcol

    t = torch.full((2,), float(rank), device=device)
    out = funcol.all_gather_tensor(t, 0, dist.group.WORLD)
    want = [float(r) for r in range(dist.get_world_size()) for _ in range(2)]
    assert out.tolist() == want, out


def _c10d_gather(rank: int, async_op: bool = False) -> None:
    t = torch.full((2,), float(rank), device="cuda:0")
    out = torch.empty(2 * dist.get_world_size(), device="cuda:0")
    work = dist.all_gather_into_tensor(out, t, async_op=async_op)
    if work is not None:
        work.wait()
    torch.cuda.synchronize()
    assert out.tolist() == [float(r) for r in range(dist.get_world_size()) for _ in range(2)], out


def _functional_op(rank: int) -> None:
    """The op functional collectives call, without their Python wrapper, then its wait."""
    t = torch.full((2,), float(rank), device="cuda:0")
    group = dist.group.WORLD.group_name
    out = torch.ops._c10d_functional.all_gather_into_tensor(t, dist.get_world_size(), group)
    out = torch.ops._c10d_functional.wait_tensor(out)
    torch.cuda.synchronize()
    assert out.tolist() == [float(r) for r in range(dist.get_world_size()) for _ in range(2)], out


def _mesh():
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(dist.group.WORLD, "cuda", mesh_dim_names=("shard",))


def _dtensor(rank: int) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor

    full = torch.arange(8.0, device="cuda:0").reshape(4, 2)
    dt = distribute_tensor(full, _mesh(), [Shard(0)])
    assert torch.equal(dt.full_tensor(), full)


def _fsdp(rank: int) -> None:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)).to("cuda:0")
    fully_shard(model, mesh=_mesh())
    model(torch.randn(4, 8, device="cuda:0")).sum().backward()
    torch.cuda.synchronize()


STAGES = {
    "plain all_reduce": _plain,
    "c10d all_gather_into_tensor": _c10d_gather,
    "c10d all_gather_into_tensor, async_op and wait": lambda rank: _c10d_gather(rank, async_op=True),
    "the functional op and wait_tensor, unwrapped": _functional_op,
    "functional all_gather": _funcol,
    "functional all_gather of CPU tensors": lambda rank: _funcol(rank, "cpu"),
    "DTensor": _dtensor,
    "FSDP2": _fsdp,
}


def _rank(rank: int, store_path: str, variant: str, stage: str, log_path: str, world: int) -> None:
    log = open(log_path, "w")  # noqa: SIM115 - lives as long as the process
    faulthandler.enable(file=log)  # a crash writes the stack it died in
    faulthandler.dump_traceback_later(WAIT_S, exit=True, file=log)  # a hang writes where it waits
    store = dist.FileStore(store_path, world)
    bound = {"device_id": torch.device("cuda:0")} if variant == "device_id" else {}
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, **bound)
    torch.cuda.set_device(0)
    start = time.time()
    try:
        STAGES[stage](rank)
        print(f"[{variant}] rank {rank}: {stage}: ok ({time.time() - start:.2f} s)", flush=True)
    except Exception as e:  # the probe reports every failure and goes on
        print(f"[{variant}] rank {rank}: {stage}: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
    faulthandler.cancel_dump_traceback_later()
    dist.destroy_process_group()


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA here: nothing to probe")
        return 0
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, {torch.cuda.device_count()} GPU(s)")
    logs = tempfile.mkdtemp(prefix="one-gpu-")
    ctx = mp.get_context("spawn")
    # "solo": one rank alone, to tell a crash of sharing the GPU from one of gloo on CUDA tensors
    for variant, world in (("plain", 2), ("device_id", 2), ("solo", 1)):
        for stage in STAGES:  # each in a fresh pair: a stage that crashes or hangs hides no other
            store = tempfile.mktemp(prefix="store-")
            paths = [os.path.join(logs, f"{variant}-{stage}-{r}.log".replace(" ", "_")) for r in range(world)]
            procs = [ctx.Process(target=_rank, args=(r, store, variant, stage, paths[r], world)) for r in range(world)]
            for p in procs:
                p.start()
            for p in procs:
                p.join(WAIT_S + 30)
                if p.is_alive():
                    p.kill()
            codes = [p.exitcode for p in procs]
            if codes != [0] * world:
                print(f"[{variant}] {stage}: exit codes {codes}", flush=True)
                with open(paths[0]) as f:
                    text = f.read()
                frames = [
                    ln for ln in text.splitlines() if ln.startswith(("Fatal", "Current thread", "Thread", "  File"))
                ]
                print("\n".join(frames[:10]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
