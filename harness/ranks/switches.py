"""The process-wide switches of torch's arithmetic, which a case must neither inherit nor leak.

torch keeps some arithmetic settings per process, not per tensor or per call: whether CUDA may
run float32 matmuls in TF32 (``torch.set_float32_matmul_precision("high")``, the same switch as
``torch.backends.cuda.matmul.allow_tf32``), whether cuBLAS may reduce bf16 and fp16 products in
their own precision, the default dtype, and grad mode. A rank runs many cases, and in each the
candidate and the reference step in the same process: a candidate that turns TF32 on in its
step and leaves it on would turn it on for the reference stepping after it, and both would
agree, in TF32; and for the next case's candidate, which would then fail for another's fault.

So every case starts from torch's defaults (``DEFAULTS``, set by the pool before each case), and
the reference steps with them whatever the candidate set (``hold``). On a CPU the switches
change nothing measured here (TF32 is CUDA's); on a GPU a candidate that leaves TF32 on is
caught (``gates/negative_controls.TF32Muon``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Switches:
    float32_matmul: str
    bf16_reduction: bool
    fp16_reduction: bool
    default_dtype: torch.dtype
    grad: bool

    @staticmethod
    def now() -> Switches:
        matmul = torch.backends.cuda.matmul
        return Switches(
            torch.get_float32_matmul_precision(),
            matmul.allow_bf16_reduced_precision_reduction,
            matmul.allow_fp16_reduced_precision_reduction,
            torch.get_default_dtype(),
            torch.is_grad_enabled(),
        )

    def use(self) -> None:
        if self == Switches.now():
            return
        torch.set_float32_matmul_precision(self.float32_matmul)
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = self.bf16_reduction
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = self.fp16_reduction
        torch.set_default_dtype(self.default_dtype)
        torch.set_grad_enabled(self.grad)


#: torch's own defaults: float32 matmuls in float32 ("highest"), reduced-precision reductions of
#: bf16 and fp16 products allowed (cuBLAS's default), float32 default dtype, grad mode on
DEFAULTS = Switches("highest", True, True, torch.float32, True)


def hold(optimizer: torch.optim.Optimizer, switches: Switches = DEFAULTS) -> torch.optim.Optimizer:
    """``optimizer`` steps with ``switches`` on, and leaves the process's as it found them."""
    saved: list[Switches] = []

    def before(*_: Any) -> None:
        saved.append(Switches.now())
        switches.use()

    def after(*_: Any) -> None:
        saved.pop().use()

    optimizer.register_step_pre_hook(before)
    optimizer.register_step_post_hook(after)
    return optimizer


@contextmanager
def held(switches: Switches = DEFAULTS) -> Iterator[None]:
    """``switches`` on inside, the process's as they were after (the reference's arithmetic outside an optimizer)."""
    saved = Switches.now()
    switches.use()
    try:
        yield
    finally:
        saved.use()
