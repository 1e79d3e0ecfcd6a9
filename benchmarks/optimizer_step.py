"""Time one Muon step: the reference on one device, and ShardedMuon's modes on all ranks.

    torchrun --nproc-per-node 2 -m benchmarks.optimizer_step            # GPUs, NCCL
    torchrun --nproc-per-node 2 -m benchmarks.optimizer_step --layers 1 --scale 16   # CPU, small

Default matrix set: ``--layers`` (32) × [4 × 4096×4096, 2 × 11008×4096, 1 × 4096×11008]
(6.48 B parameters at 32 layers), float32 parameters, bf16 Newton–Schulz, 5 iterations.
``--scale k`` divides every side by k for a quick run. All timings come from one run: the
reference runs on rank 0's device alone (the others wait at a barrier), then each mode on
every rank, each step starting after a barrier. Prints median seconds per step (the slowest
rank's), the ratio to the reference, the host's seconds until ``step()`` returned (the rest is
the device catching up), peak memory of rank 0 during the steps on GPUs, and whether the modes'
parameters equal the reference's bit for bit after the timed steps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import reference
from distributed_impl import ShardedMuon

LAYER = [(4096, 4096)] * 4 + [(11008, 4096)] * 2 + [(4096, 11008)]
# torch.optim.Muon's conventions (eps_form="clamp"), so torchtitan's DistMuon, which follows
# them, computes the same bits as the reference on float32 parameters.
SETTINGS = dict(lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.01, ns_dtype=torch.bfloat16, eps_form="clamp")
TORCH_MUON_SETTINGS = dict(lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.01)


def _dist_muon_factory(
    wheel: str, shapes: list[tuple[int, int]]
) -> Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]:
    """torchtitan's DistMuon from a wheel, loading only its flex_shard package.

    torchtitan's package ``__init__`` files pull in its trainer's dependencies; the
    optimizer needs none of them, so the two parent packages are stood in by bare
    namespace modules pointing into the unpacked wheel.
    """
    import sys
    import tempfile
    import types
    import zipfile

    root = tempfile.mkdtemp(prefix="torchtitan-")
    zipfile.ZipFile(wheel).extractall(root)
    for name in ("torchtitan", "torchtitan.distributed"):
        module = types.ModuleType(name)
        module.__path__ = [os.path.join(root, *name.split("."))]
        sys.modules[name] = module
    from torchtitan.distributed.flex_shard import BucketConfig, ComputeLayout, Owned, build_dist_muon

    layers = len(shapes) // len(LAYER)
    names = [f"layers.{i // len(LAYER)}.w{i % len(LAYER)}" for i in range(len(shapes))]
    owned = ComputeLayout(shardings_by_mesh_axis={"dp_shard": Owned()})

    def build(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return build_dist_muon(
            [{"params": params, "param_names": names}],
            compute_sharding_by_fqn=dict.fromkeys(names, owned),
            bucket_configs=[BucketConfig(patterns=(f"layers.{i}.*",), name=f"layer{i}") for i in range(layers)],
            **TORCH_MUON_SETTINGS,
        )

    return build


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _pause(device: torch.device, seconds: float, busy: bool) -> None:
    """Idles ``seconds``, or with ``busy`` keeps the device multiplying matrices as long:
    the same pause without the rest, to tell a power limiter's effect from anything else."""
    if not busy:
        time.sleep(seconds)
        return
    side = 8192 if device.type == "cuda" else 256
    a = torch.randn(side, side, device=device, dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            a @ a
        _sync(device)


def _time(
    step: Callable[[], None], device: torch.device, warmup: int, iters: int, *, together: bool, pause: float, busy: bool
) -> tuple[list[float], list[float]]:
    """Wall seconds of each step (to the device's last kernel) and the host's seconds until
    ``step()`` returned. With ``together`` every rank starts each step after a barrier, so
    no rank's time includes waiting for a peer that is still finishing the step before.
    ``pause`` seconds before each timed step (idle, or ``busy``) let a power-capped device
    start it rested (or not)."""
    for _ in range(warmup):
        step()
    times, host = [], []
    for _ in range(iters):
        _sync(device)
        if pause:
            _pause(device, pause, busy)
        if together:
            dist.barrier()
            _sync(device)
        start = time.perf_counter()
        step()
        host.append(time.perf_counter() - start)
        _sync(device)
        times.append(time.perf_counter() - start)
    return times, host


def _peak_gib(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")


STEP_LABEL = "benchmark step"  # the profiled step's host range, which benchmarks.trace_summary reads


def _profile(step: Callable[[], None], mode: str, rank: int, trace_dir: str | None, *, together: bool) -> None:
    """One more step on every rank under the profiler (a collective needs them all), started
    after a barrier with ``together``, as the timed steps are; rank 0 prints its top
    kernels, and with ``trace_dir`` every rank writes a Chrome trace there."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        if together:  # inside: starting the profiler takes each rank a different time
            dist.barrier()
            torch.cuda.synchronize()
        with record_function(STEP_LABEL):
            step()
        torch.cuda.synchronize()
    if trace_dir:
        os.makedirs(trace_dir, exist_ok=True)
        slug = "".join(c if c.isalnum() else "_" for c in mode).strip("_")
        prof.export_chrome_trace(os.path.join(trace_dir, f"{slug}.rank{rank}.json"))
    if rank != 0:
        return
    print(f"--- profile of one {mode} step on rank 0 ---")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--scale", type=int, default=1, help="divide every matrix side by this")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--modes", default="all_ranks,owner_split")
    parser.add_argument("--bucket-numel", type=int, default=1 << 26, help="ShardedMuon's bucket_numel (owner_split)")
    parser.add_argument(
        "--batch-numel", type=int, default=0, help="ShardedMuon's batch_numel (0, the default: never batch)"
    )
    parser.add_argument(
        "--pause",
        type=float,
        default=0.0,
        help="idle this many seconds before each timed step (default 0: steps back to back, as in training)",
    )
    parser.add_argument(
        "--busy-pause", action="store_true", help="keep the device multiplying matrices during --pause instead of idle"
    )
    parser.add_argument(
        "--reference-every-rank",
        action="store_true",
        help="also time the reference on every rank's device at once (how fast each device is under load)",
    )
    parser.add_argument("--profile", action="store_true", help="print rank 0's top kernels for one step of each mode")
    parser.add_argument("--trace", metavar="DIR", help="with --profile, also write each rank's Chrome trace to DIR")
    parser.add_argument(
        "--torchtitan",
        metavar="WHEEL",
        help="a torchtitan 0.3.0 wheel: also time its DistMuon (flex_shard, Owned layouts, a bucket per layer)",
    )
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp_shard",))
    shapes = [(r // args.scale, c // args.scale) for _ in range(args.layers) for r, c in LAYER]
    numel = sum(r * c for r, c in shapes)
    flops = sum(2 * 5 * (2 * min(r, c) ** 2 * max(r, c) + min(r, c) ** 3) for r, c in shapes)

    def inputs() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        # Drawn on the device: the same seed gives the same numbers on every rank's GPU.
        gen = torch.Generator(device).manual_seed(0)
        params = [torch.randn(s, generator=gen, device=device) for s in shapes]
        grads = [torch.randn(s, generator=gen, device=device) for s in shapes]
        return params, grads

    def reference_steps() -> tuple[list[float], list[float], reference.Muon, list[torch.nn.Parameter]]:
        params, grads = inputs()
        plain = [torch.nn.Parameter(p) for p in params]
        for p, g in zip(plain, grads, strict=True):
            p.grad = g
        opt = reference.Muon(plain, **SETTINGS)
        times, host = _time(
            opt.step, device, args.warmup, args.iters, together=False, pause=args.pause, busy=args.busy_pause
        )
        return times, host, opt, plain

    def release() -> None:
        if use_cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)

    results: dict[str, tuple[float, float, float]] = {}  # median s, host median s, peak GiB
    ref_final: list[torch.Tensor] = []
    if rank == 0:
        times, host, opt, plain = reference_steps()
        results["reference (1 device)"] = (statistics.median(times), statistics.median(host), _peak_gib(device))
        ref_final = [p.detach().cpu() for p in plain]
        if args.profile:
            _profile(
                opt.step, "reference (1 device)", rank, args.trace, together=False
            )  # after the copy: one more step
        del opt, plain
        release()
    dist.barrier()
    if args.reference_every_rank:
        times, host, opt, plain = reference_steps()
        del opt, plain
        release()
        medians = [torch.zeros(1, device=device) for _ in range(world)]
        dist.all_gather(medians, torch.tensor([statistics.median(times)], device=device))
        if rank == 0:
            for r, median in enumerate(medians):
                results[f"reference on rank {r} (all at once)"] = (float(median), float("nan"), float("nan"))

    dist.barrier()

    contenders: dict[str, Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]] = {
        f"ShardedMuon {mode} ({world} ranks)": partial(
            ShardedMuon, mode=mode, bucket_numel=args.bucket_numel, batch_numel=args.batch_numel, **SETTINGS
        )
        for mode in args.modes.split(",")
    }
    if args.torchtitan:
        contenders[f"torchtitan DistMuon Owned ({world} ranks)"] = _dist_muon_factory(args.torchtitan, shapes)
    bitwise: dict[str, bool] = {}
    for name, factory in contenders.items():
        params, grads = inputs()
        sharded = [torch.nn.Parameter(distribute_tensor(p, mesh, [Shard(0)])) for p in params]
        for p, g in zip(sharded, grads, strict=True):
            p.grad = distribute_tensor(g, mesh, p.placements)
        del params, grads
        release()
        try:
            opt = factory(sharded)
            times, host = _time(
                opt.step, device, args.warmup, args.iters, together=True, pause=args.pause, busy=args.busy_pause
            )
        except Exception as e:  # a peer that cannot run here is reported, not fatal
            if rank == 0:
                print(f"{name}: {type(e).__name__}: {e}")
            continue
        slowest = torch.tensor([statistics.median(times), statistics.median(host)], device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        fulls = [p.full_tensor().cpu() for p in sharded]
        if args.profile:
            _profile(opt.step, name, rank, args.trace, together=True)  # after the comparison: it takes one more step
        if rank == 0:
            results[name] = (float(slowest[0]), float(slowest[1]), _peak_gib(device))
            bitwise[name] = all(
                torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(fulls, ref_final, strict=True)
            )
        del opt, sharded, fulls
        release()

    if rank == 0:
        base = results["reference (1 device)"][0]
        print(
            f"{len(shapes)} matrices, {numel / 1e9:.2f} B parameters, {flops / 1e12:.0f} TFLOP of Newton–Schulz per step; "
            f"{args.warmup} warm-up + {args.iters} timed steps"
            + (f", each after {args.pause:g} s {'busy' if args.busy_pause else 'idle'}" if args.pause else "")
            + f"; torch {torch.__version__} on {device.type}"
        )
        print(
            f"{'what':40} {'median s/step':>14} {'ratio':>7} {'host s/step':>12} {'peak GiB (rank 0)':>18} {'bitwise':>8}"
        )
        for name, (seconds, host_seconds, peak) in results.items():
            same = "" if name not in bitwise else ("yes" if bitwise[name] else "NO")
            print(f"{name:40} {seconds:14.4f} {seconds / base:7.3f} {host_seconds:12.4f} {peak:18.1f} {same:>8}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Skip the interpreter's teardown, as the pool's ranks do: under load, a 2-rank gloo run
    # sometimes aborted there ("terminate called without an active exception") after every
    # figure was printed, in about 1 run in 6 of its test.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
