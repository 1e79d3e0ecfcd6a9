"""Measures how far correct and wrong gradient-norm clipping land from the float64 norm of the
full gradients: the figures behind ``harness.verdicts.compare.CLIP_NORM``.

Run: ``python examples/clip_norm_calibration.py --nproc 4 --cases 300`` (real process groups,
gloo; the clipping gate's own cases, ``clip_cases``, the 2- and 1-norm).

Correct: ``torch.nn.utils.clip_grad_norm_`` on the DTensor gradients, and the hand-written clip
the controls are built on (``gates.clip_controls.UnplantedClipMuon``). Wrong: each control.
For each tier (by the case's lowest-precision gradient dtype) it prints the correct variants'
worst relative error and, per control, on the cases where its bug changed the norm (it differs
from the unplanted clip's), how many lie past the tier's bound, the nearest and the median.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings

from gates.clip_controls import CLIP_CONTROLS, UnplantedClipMuon
from harness.algorithms import MUON
from harness.cases import Case, clip_cases
from harness.ranks import RankPool
from harness.runner import RANK_PRELOAD
from harness.runner.dispatch import run_on
from harness.tasks.clipping import norm_tier
from harness.verdicts.compare import CLIP_NORM


def drawn(nproc: int, count: int) -> list[Case]:
    """``count`` clipping cases on up to ``nproc`` ranks, the infinity norm (bitwise) made the 2-norm."""
    out: list[Case] = []

    @settings(max_examples=count, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(clip_cases(max_world=nproc, algorithm=MUON))
    def collect(case: Case) -> None:
        assert case.clip is not None
        if math.isinf(case.clip.norm_type):
            case = replace(case, clip=case.clip._replace(norm_type=2.0))
        out.append(case)

    collect()
    return out


def norm_errors(pool: RankPool, case: Case) -> list[float]:
    """The relative error of every norm a clip returned (every rank, every step); none where the case failed."""
    ran = run_on(pool, case, "optimizer")
    if ran.outcome.failure is not None:
        return []
    return [c.rel_fro for c in ran.comparisons if c.tensor == "clip.total_norm"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--cases", type=int, default=300)
    args = parser.parse_args()
    variants: dict[str, Any] = {"torch": None, "UnplantedClipMuon": UnplantedClipMuon}
    variants |= {name: planted for name, (planted, _, _) in CLIP_CONTROLS.items()}
    errors: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    with RankPool(args.nproc, preload=RANK_PRELOAD) as pool:
        for case in drawn(args.nproc, args.cases):
            tier = norm_tier(case).name
            for name, candidate in variants.items():
                errors[tier][name].append(max(norm_errors(pool, replace(case, candidate=candidate)), default=math.nan))
    for tier, by_variant in sorted(errors.items()):
        correct = [e for name in ("torch", "UnplantedClipMuon") for e in by_variant[name] if not math.isnan(e)]
        worst = max(correct, default=0.0)
        print(f"{tier}: {len(by_variant['torch'])} cases; correct variants' worst relative error {worst:.3g}")
        bound = CLIP_NORM[tier.removeprefix("clip_norm_").replace("fp32", "float32").replace("bf16", "bfloat16")].rtol
        for name in CLIP_CONTROLS:
            pairs = zip(by_variant[name], by_variant["UnplantedClipMuon"], strict=True)
            touched = sorted(wrong for wrong, right in pairs if wrong != right and not math.isnan(wrong))
            past = sum(e > bound for e in touched)
            line = f"nearest {touched[0]:.3g}, median {touched[len(touched) // 2]:.3g}" if touched else ""
            print(
                f"  {name}: its bug changed the norm in {len(touched)} cases, {past} past the bound {bound:g}; {line}"
            )


if __name__ == "__main__":
    main()
