"""Is a Newton–Schulz kernel bitwise reproducible? The sharded optimizer and the reference
can only agree bit for bit (gate ``kernel:sharded``) if the kernel gives the same bits for
the same input wherever it runs. This checks three ways that can fail:

* run to run: the same input twice in one process;
* across processes: fresh processes that first ran *different* shapes (a compiled kernel
  may choose its code from the first shapes it saw);
* view vs copy: the input as a view at an unaligned offset of a bigger buffer, against a
  fresh copy (GPU kernels may choose their code from a pointer's alignment).

    python -m benchmarks.kernel_determinism --kernel examples.compiled_kernel:compiled_ns --device cuda
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
from typing import Any

TARGETS = [(1, 2), (2, 1), (1, 64), (2, 4), (3, 20), (31, 13), (13, 31), (64, 64), (128, 32), (7, 300)]
WARM_UPS = [[], [(4, 4), (64, 8)], [(300, 7), (33, 17), (96, 96)], [(1, 7), (5, 3), (2, 2)]]


def _digest(t: Any) -> str:
    return hashlib.sha1(t.float().cpu().numpy().tobytes()).hexdigest()[:12]


def _worker(spec: str, device: str, dtype: str, warm: list[tuple[int, int]]) -> dict[str, Any]:
    import torch

    from harness.candidates import load_object

    fn = load_object(spec)
    dt = getattr(torch, dtype)
    for shape in warm:
        fn(torch.randn(shape, device=device).to(dt), 5)
    out: dict[str, Any] = {}
    for shape in TARGETS:
        g = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape))).to(device=device, dtype=dt)
        first, second = fn(g.clone(), 5), fn(g.clone(), 5)
        buffer = torch.empty(g.numel() + 1, device=device, dtype=dt)
        view = buffer[1:].view(shape)
        view.copy_(g)
        out[f"{shape[0]}x{shape[1]}"] = (_digest(first), _digest(second), _digest(fn(view, 5)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel", default="examples.polar_express_kernel:polar_express")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    with ctx.Pool(len(WARM_UPS)) as pool:
        runs = pool.starmap(_worker, [(args.kernel, args.device, args.dtype, w) for w in WARM_UPS])
    print(f"{args.kernel} on {args.device}, {args.dtype}; processes warmed up with {WARM_UPS}")
    print(f"{'input':>8}  {'run to run':>10}  {'across processes':>16}  {'view vs copy':>12}")
    for name in runs[0]:
        per = [r[name] for r in runs]
        run_to_run = all(a == b for a, b, _ in per)
        across = len({a for a, _, _ in per}) == 1
        view = all(a == v for a, _, v in per)
        print(
            f"{name:>8}  {'same' if run_to_run else 'DIFFERS':>10}  {'same' if across else 'DIFFERS':>16}  "
            f"{'same' if view else 'DIFFERS':>12}"
        )


if __name__ == "__main__":
    main()
