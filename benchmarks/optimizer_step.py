"""Time one Muon step: the reference on one device, and ShardedMuon's modes on all ranks.

    torchrun --nproc-per-node 2 -m benchmarks.optimizer_step            # GPUs, NCCL
    torchrun --nproc-per-node 2 -m benchmarks.optimizer_step --layers 1 --scale 16   # CPU, small

Default matrix set: ``--layers`` (32) × [4 × 4096×4096, 2 × 11008×4096, 1 × 4096×11008]
(6.48 B parameters at 32 layers), float32 parameters, bf16 Newton–Schulz, 5 iterations.
``--scale k`` divides every side by k for a quick run. All timings come from one run: the
reference runs on rank 0's device alone (the others wait at a barrier), then each mode on
every rank. Prints median seconds per step, the ratio to the reference, peak memory of rank 0
during the steps on GPUs, and whether the modes' parameters equal the reference's bit for bit after
the timed steps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor

import reference
from distributed_impl import ShardedMuon

LAYER = [(4096, 4096)] * 4 + [(11008, 4096)] * 2 + [(4096, 11008)]
SETTINGS = dict(lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.01, ns_dtype=torch.bfloat16)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(step: Callable[[], None], device: torch.device, warmup: int, iters: int) -> list[float]:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - start)
    return times


def _peak_gib(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")


def _profile(step: Callable[[], None], mode: str, rank: int) -> None:
    """One more step on every rank under the profiler (a collective needs them all); rank 0 prints."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
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
    parser.add_argument("--profile", action="store_true", help="print rank 0's top kernels for one step of each mode")
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    mesh = init_device_mesh(device.type, (world,))
    shapes = [(r // args.scale, c // args.scale) for _ in range(args.layers) for r, c in LAYER]
    numel = sum(r * c for r, c in shapes)
    flops = sum(2 * 5 * (2 * min(r, c) ** 2 * max(r, c) + min(r, c) ** 3) for r, c in shapes)

    def inputs() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        # Drawn on the device: the same seed gives the same numbers on every rank's GPU.
        gen = torch.Generator(device).manual_seed(0)
        params = [torch.randn(s, generator=gen, device=device) for s in shapes]
        grads = [torch.randn(s, generator=gen, device=device) for s in shapes]
        return params, grads

    results: dict[str, tuple[float, float]] = {}
    ref_final: list[torch.Tensor] = []
    if rank == 0:
        params, grads = inputs()
        plain = [torch.nn.Parameter(p) for p in params]
        for p, g in zip(plain, grads, strict=True):
            p.grad = g
        opt = reference.Muon(plain, **SETTINGS)
        times = _time(opt.step, device, args.warmup, args.iters)
        results["reference (1 device)"] = (statistics.median(times), _peak_gib(device))
        ref_final = [p.detach().cpu() for p in plain]
        del opt, plain, params, grads
        if use_cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
    dist.barrier()

    bitwise: dict[str, bool] = {}
    for mode in args.modes.split(","):
        params, grads = inputs()
        sharded = [torch.nn.Parameter(distribute_tensor(p, mesh, [torch.distributed.tensor.Shard(0)])) for p in params]
        for p, g in zip(sharded, grads, strict=True):
            p.grad = distribute_tensor(g, mesh, p.placements)
        del params, grads
        if use_cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        opt = ShardedMuon(sharded, mode=mode, **SETTINGS)
        times = _time(opt.step, device, args.warmup, args.iters)
        median = torch.tensor([statistics.median(times)], device=device)
        dist.all_reduce(median, op=dist.ReduceOp.MAX)
        fulls = [p.full_tensor().cpu() for p in sharded]
        if args.profile:
            _profile(opt.step, mode, rank)  # after the comparison: it takes one more step
        if rank == 0:
            results[f"ShardedMuon {mode} ({world} ranks)"] = (float(median), _peak_gib(device))
            bitwise[mode] = all(
                torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(fulls, ref_final, strict=True)
            )
        del opt, sharded, fulls
        if use_cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)

    if rank == 0:
        base = results["reference (1 device)"][0]
        print(
            f"{len(shapes)} matrices, {numel / 1e9:.2f} B parameters, {flops / 1e12:.0f} TFLOP of Newton–Schulz per step; "
            f"{args.warmup} warm-up + {args.iters} timed steps; torch {torch.__version__} on {device.type}"
        )
        print(f"{'what':36} {'median s/step':>14} {'ratio':>7} {'peak GiB (rank 0)':>18} {'bitwise':>8}")
        for name, (seconds, peak) in results.items():
            mode = name.split()[1] if name.startswith("ShardedMuon") else ""
            same = "" if not mode else ("yes" if bitwise[mode] else "NO")
            print(f"{name:36} {seconds:14.4f} {seconds / base:7.3f} {peak:18.1f} {same:>8}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
