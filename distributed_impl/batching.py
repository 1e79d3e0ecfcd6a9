"""Same-shape batching of Newton–Schulz, only where a probe found the reference's bits.

Opt-in (``ShardedMuon(batch_numel=…)``; off by default), and not a guarantee: a probe
that agrees proves nothing about the next input. A batched bf16 product may accumulate in
another order than the single one, and rounding to bf16 hides that on most inputs: on CPU
(torch 2.13), two [13, 24] bf16 matrices, Polar Express, batched against one by one,
differed on 1 input in 200 (3 in 200 for [24, 13]; none for fp32 Newton–Schulz in 800),
the first difference in ``X Xᵀ`` of iteration 3. The resharding gate found it at 8
ranks: a stack probed bitwise on step 0 came out 1 bf16 ULP off on step 1.

An owner rank orthogonalizes many matrices per bucket. Small ones cost more in kernel
launches than in arithmetic, and one batched product per Newton–Schulz step over a stack
of equal shapes is several times faster (8 × 1024², bf16 on H200: 2.53 ms one by one,
0.72 ms batched). But a batched product may run a different kernel than the single ones,
and the reference orthogonalizes one matrix at a time, so batching is bitwise only where
the two kernels agree. That is a property of the shape, the count, the dtypes, the
settings and the device (which kernel runs), so the first time a stack is met it is
computed both ways and the one-by-one result is used; the stack is batched from then on
only if every bit agreed. Whether two kernels' results agree, though, also depends on the
numbers (above). Large matrices are never batched: they gain nothing (4 × 4096²:
12.0 ms one by one, 12.9 ms batched) and stacking them costs a copy.

A probe counts only if it could have disagreed: a stack with an all-zero matrix gives
zeros both ways. Torch's distributed-checkpoint state-dict API steps a fresh optimizer
once on zero gradients to create its state (``_init_optim_state``); that step once
"proved" batching bitwise, and the first real step after loading a checkpoint then came
out 2 ULP off on fp32 Newton–Schulz (found by the resharding gate; the same as the H200's
checkpoint-gate failure at world 1).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch import Tensor

from reference import group_orthogonalizer, orthogonalize_batch

Many = Callable[[list[Tensor]], list[Tensor]]


def same_bits(a: Tensor, b: Tensor) -> bool:
    """Equal bit patterns (tells -0.0 from +0.0 and NaN payloads apart)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))


class SameShapeBatching:
    """Remembers, per process, which stacks batch bitwise; ``max_numel`` is the largest
    matrix (in elements) worth batching, 0 turns batching off."""

    def __init__(self, max_numel: int = 1 << 22) -> None:
        if max_numel < 0:
            raise ValueError(f"batch_numel={max_numel} must be 0 (off) or positive")
        self.max_numel = max_numel
        self.verdicts: dict[Hashable, bool] = {}

    def orthogonalizer(self, group: dict[str, Any], fn: Callable[..., Tensor] | None) -> Many:
        """``matrices -> results`` with a param group's settings. A plug-in ``fn`` is
        never batched: only the reference's own function has a batched form."""
        one = group_orthogonalizer(group, fn)
        if fn is not None or self.max_numel == 0:
            return lambda matrices: [one(m) for m in matrices]
        many = group_orthogonalizer(group, orthogonalize_batch)
        settings = tuple(group[k] for k in ("ns_steps", "ns_coefficients", "eps", "eps_form", "ns_dtype"))

        def run(matrices: list[Tensor]) -> list[Tensor]:
            out: list[Tensor | None] = [None] * len(matrices)
            stacks: dict[tuple[Any, ...], list[int]] = defaultdict(list)
            for i, m in enumerate(matrices):
                stacks[(tuple(m.shape), m.dtype, m.device)].append(i)
            for (shape, dtype, device), idx in stacks.items():
                key = (shape, len(idx), dtype, device, settings)
                numel = shape[0] * shape[1]
                if len(idx) < 2 or numel > self.max_numel or self.verdicts.get(key) is False:
                    results = [one(matrices[i]) for i in idx]
                else:
                    batched = list(many(torch.stack([matrices[i] for i in idx])).unbind(0))
                    if key in self.verdicts:
                        results = batched
                    else:
                        results = [one(matrices[i]) for i in idx]
                        if all(bool(matrices[i].any()) for i in idx):  # else the probe proves nothing
                            self.verdicts[key] = all(same_bits(a, b) for a, b in zip(batched, results, strict=True))
                for i, r in zip(idx, results, strict=True):
                    out[i] = r
            return [r for r in out if r is not None]

        return run
