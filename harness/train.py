"""Train the small transformer with FSDP2 + the sharded Muon, with a progress bar and a report.

    python -m harness.train                       2 ranks on CPU (gloo), 200 steps
    python -m harness.train --device cuda --nproc 2 --steps 2000 --dim 256 --layers 4
    python -m harness.train --mlp moe --fused-qkv --report muongate-train

The same model and data as the training gate (``harness.models.transformer``), which proves
this training run is the single-process run bit for bit on 2 ranks. The loss curve
(bits per byte) and the held-out figures go to ``REPORT/results.jsonl`` after every
chunk of steps, and to ``equivalence.html`` / ``.md`` at the end.
"""

from __future__ import annotations

import argparse
import time
import uuid
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from harness.models.transformer import TransformerCase
from harness.ranks import RankPool
from harness.runinfo import make_header
from harness.runner import RANK_PRELOAD
from harness.tasks.training import train_steps
from reports.files import write_files
from reports.records import Training
from reports.stream import ResultStream, read_stream
from reports.summary import summarize
from reports.terminal import render


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="gloo on CPU or NCCL, one GPU per rank"
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--chunk", type=int, default=10, help="steps between progress updates and held-out figures")
    parser.add_argument("--mlp", choices=["dense", "moe"], default="dense")
    parser.add_argument("--fused-qkv", action="store_true", help="one [3d, d] QKV matrix instead of three [d, d]")
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", default="muongate-train", help="report directory (default muongate-train)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.chunk < 1:
        parser.error("--steps and --chunk must be at least 1")
    if args.dim % args.heads:
        parser.error(f"--dim {args.dim} must be a multiple of --heads {args.heads}")
    case = TransformerCase(
        f"train {args.mlp}",
        mlp=args.mlp,
        fused_qkv=args.fused_qkv,
        world_size=args.nproc,
        steps=args.steps,
        seed=args.seed,
        dim=args.dim,
        heads=args.heads,
        layers=args.layers,
        seq=args.seq,
        batch=args.batch,
    )
    devices = [f"cuda:{r}" for r in range(args.nproc)] if args.device == "cuda" else ["cpu"] * args.nproc
    backend = "nccl" if args.device == "cuda" else "gloo"
    directory = Path(args.report)
    stream = ResultStream(directory / "results.jsonl")
    stream.write(make_header(backend=backend, devices=devices, nproc=args.nproc), sync=True)
    console = Console(emoji=False)
    run_id = uuid.uuid4().hex
    train_bits: list[float] = []
    held_out: list[float] = []
    start = time.monotonic()
    with RankPool(args.nproc, preload=RANK_PRELOAD, backend=backend, devices=devices, case_timeout_s=600) as pool:
        first = pool.run(train_steps, (run_id, case, 0, 0))
        if first.failure is not None:
            console.print(first.failure.describe())
            return 1
        held_out.append(first.results[0].figures["held_out_bits"])
        with Progress(
            TextColumn("[bold]training"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[bits]}"),
            TimeRemainingColumn(),
            console=console,
        ) as progress:
            task = progress.add_task("train", total=args.steps, bits="")
            for step in range(0, args.steps, args.chunk):
                count = min(args.chunk, args.steps - step)
                outcome = pool.run(train_steps, (run_id, case, step, count))
                if outcome.failure is not None:
                    console.print(outcome.failure.describe())
                    return 1
                train_bits += outcome.results[0].figures["train_bits"]
                held_out.append(outcome.results[0].figures["held_out_bits"])
                record = Training(
                    "train",
                    case.describe(),
                    args.nproc,
                    tuple(train_bits),
                    (held_out[0], held_out[-1]),
                    round(time.monotonic() - start, 3),
                )
                stream.write(record, sync=True)
                progress.update(
                    task, advance=count, bits=f"{train_bits[-1]:.3f} bits/byte (held-out {held_out[-1]:.3f})"
                )
    stream.close()
    records = list(read_stream(directory / "results.jsonl"))
    summary = summarize(records)
    console.print(render(summary))
    write_files(summary, directory)
    console.print(f"report: {directory}/equivalence.html, equivalence.md, results.jsonl")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
