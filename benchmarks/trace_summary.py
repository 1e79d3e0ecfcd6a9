"""Where one profiled optimizer step's time goes, per rank, from ``optimizer_step --trace DIR``.

    python -m benchmarks.trace_summary DIR          # every *.rankN.json trace in DIR

For each trace (one contender on one rank) it prints, in milliseconds:

* ``wall``: from the host entering ``step()`` to the later of its return and the last kernel;
* ``lead``: from entering ``step()`` to the first kernel (host work the device waited for);
* ``busy``: the union of the compute kernels (everything but NCCL's), and ``idle``, the
  rest of the span between the first and the last kernel;
* ``matmul``, ``copy`` and ``other`` kernel time (they add up to ``busy`` unless kernels overlap);
* ``nccl``: the union of the NCCL kernels, resident on the device whether moving data or
  waiting for a peer;
* ``mm|nccl``: matmul time that ran while an NCCL kernel was resident, and ``mm+``: how much
  longer those matmuls took than the same kernel (name and grid) took with no NCCL kernel
  beside it, i.e. what sharing the device with communication cost;
* ``gaps``: the three longest idle stretches of the compute stream, as ``start+length``
  from the first kernel.
"""

from __future__ import annotations

import argparse
import bisect
import json
import re
import statistics
import sys
from collections import defaultdict
from itertools import pairwise
from pathlib import Path
from typing import Any

from benchmarks.optimizer_step import STEP_LABEL

Interval = tuple[float, float]
KERNEL_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def kind(event: dict[str, Any]) -> str:
    name = event["name"]
    lower = name.lower()
    if "nccl" in lower:
        return "nccl"
    if event.get("cat") == "gpu_memcpy" or "copy" in lower:
        return "copy"
    if any(tag in lower for tag in ("gemm", "nvjet", "cutlass", "xmma")):
        return "matmul"
    return "other"


def union(intervals: list[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def overlap(interval: Interval, merged: list[Interval]) -> float:
    """Length of ``interval`` covered by the sorted, disjoint ``merged`` intervals."""
    start, end = interval
    total = 0.0
    for s, e in merged[max(0, bisect.bisect_right(merged, (start, start)) - 1) :]:
        if s >= end:
            break
        total += max(0.0, min(e, end) - max(s, start))
    return total


def summarize(trace: dict[str, Any]) -> dict[str, Any]:
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == STEP_LABEL]
    # Only the step's kernels: not the barrier's before it.
    since = steps[0]["ts"] if steps else float("-inf")
    kernels = [e for e in events if e.get("cat") in KERNEL_CATEGORIES and e["ts"] >= since]
    if not kernels:
        raise ValueError("the trace holds no device kernels (was it taken on a GPU?)")
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in kernels:
        by_kind[kind(e)].append(e)

    def spans(es: list[dict[str, Any]]) -> list[Interval]:
        return [(e["ts"], e["ts"] + e["dur"]) for e in es]

    first = min(e["ts"] for e in kernels)
    last = max(e["ts"] + e["dur"] for e in kernels)
    compute = union(spans([e for e in kernels if kind(e) != "nccl"]))
    nccl = union(spans(by_kind["nccl"]))
    busy = sum(e - s for s, e in compute)
    gaps = sorted((a[1] - b[0], a[1]) for a, b in pairwise(compute))  # longest first

    alone: dict[tuple[str, str], list[float]] = defaultdict(list)
    beside: list[tuple[tuple[str, str], float, float]] = []
    for e in by_kind["matmul"]:
        key = (e["name"], str(e.get("args", {}).get("grid")))
        shared = overlap((e["ts"], e["ts"] + e["dur"]), nccl)
        if shared:
            beside.append((key, e["dur"], shared))
        else:
            alone[key].append(e["dur"])
    slowdown = sum(dur - statistics.median(alone[key]) for key, dur, _ in beside if key in alone)

    row: dict[str, Any] = {
        "busy": busy,
        "idle": (last - first) - busy,
        **{k: sum(e["dur"] for e in by_kind[k]) for k in ("matmul", "copy", "other")},
        "nccl": sum(e - s for s, e in nccl),
        "mm|nccl": sum(shared for _, _, shared in beside),
        "mm+": slowdown,
        "gaps": " ".join(f"{(at - first) / 1e3:.0f}+{-minus / 1e3:.1f}" for minus, at in gaps[:3]),
    }
    if steps:
        step = steps[0]
        row["wall"] = max(step["ts"] + step["dur"], last) - step["ts"]
        row["lead"] = first - step["ts"]
    return row


COLUMNS = ("wall", "lead", "busy", "idle", "matmul", "copy", "other", "nccl", "mm|nccl", "mm+")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="trace files, or folders of *.rankN.json traces")
    args = parser.parse_args(argv)
    files = sorted(f for p in args.paths for f in (p.glob("*.json") if p.is_dir() else [p]))
    if not files:
        print("no trace files found", file=sys.stderr)
        return 2
    print(f"{'trace':44} " + " ".join(f"{c:>8}" for c in COLUMNS) + "  gaps (ms)")
    for f in files:
        row = summarize(json.loads(f.read_text()))
        cells = " ".join(f"{row[c] / 1e3:8.1f}" if c in row else f"{'-':>8}" for c in COLUMNS)
        print(f"{re.sub(r'.json$', '', f.name):44} {cells}  {row['gaps']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
