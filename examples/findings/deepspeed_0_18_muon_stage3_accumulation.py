"""DeepSpeed 0.18.9's Muon at ZeRO stage 3 with gradient accumulation runs Muon once per
micro-batch instead of once per step: its momentum takes each micro-batch's partial gradient, and
the step adds up one orthogonalized update per micro-batch, so a matrix moves about
``gradient_accumulation_steps`` times as far as Muon moves it.

Run: ``PYTHONPATH=/tmp/ds-old python examples/findings/deepspeed_0_18_muon_stage3_accumulation.py``
(deepspeed and torch only; it starts its own 2 ranks on the CPU over gloo; exits 0 while it shows
the finding, 1 once it is gone).

Why: stage 3 calls ``_apply_distributed_muon_update`` from ``__avg_scatter_contiguous_grads``,
which reduces every micro-batch's gradient bucket, and nothing there waits for the accumulation
boundary. Each call lerps the momentum towards that micro-batch's gradient (scaled by 1/accumulation
steps, as DeepSpeed scales the loss) and writes the orthogonalized update back in place of the
gradient, and ``partition_grads`` then sums those updates over the micro-batches. With accumulation
1 the step is right. A bug in DeepSpeed, in every release whose stage 3 takes Muon (0.18.9 to
0.19.7); 0.19.8 runs Muon once per step on the accumulated gradient
(``_apply_muon_to_accumulated_grads``, deepspeedai/DeepSpeed#8443).

The case: a ``[1, 1]`` matrix at 1, one step at lr 0.02 with 2 micro-batches; each rank's
gradient is 1/8 in both micro-batches, so the step's mean gradient is 1/8.
"""

import logging
import os
import sys
import tempfile
import warnings
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import deepspeed.ops
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from deepspeed.utils import logger, safe_get_full_fp32_param, safe_get_full_optimizer_state

# No shared-memory op built at start-up: a table that answers False for every op (0.18 indexes
# it, so an empty one raises KeyError: 'deepspeed_shm_comm').
deepspeed.ops.__compatible_ops__ = defaultdict(bool)
torch._dynamo.config.disable = True  # DeepSpeed's Muon is torch.compile'd; eager is enough here
logger.setLevel(logging.WARNING)
warnings.filterwarnings("ignore", category=FutureWarning)  # torch's on DeepSpeed's all_gather_into_tensor

LR = 0.02
BETA = 0.95
GRADIENT = 1 / 8  # every rank's, in every micro-batch


class Feed(torch.nn.Module):
    """One matrix whose gradient is exactly the coefficient tensor fed to it."""

    def __init__(self) -> None:
        super().__init__()
        self.p0 = torch.nn.Parameter(torch.ones(1, 1))
        self.p0.use_muon = True  # DeepSpeed's Muon reads this flag on every parameter

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        return (self.p0 * c).sum()


def quintic(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Keller Jordan's published Newton–Schulz quintic in bf16, the orthogonalization 0.18.9 runs
    (coefficients 3.4445, -4.7750, 2.0315; Frobenius norm plus 1e-7; wide orientation)."""
    x = g.bfloat16()
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    x = x / (x.norm() + 1e-7)
    for _ in range(steps):
        a = x @ x.T
        x = 3.4445 * x + (-4.7750 * a + 2.0315 * a @ a) @ x
    return (x.T if tall else x).float() * max(1, g.size(0) / g.size(1)) ** 0.5


def expected() -> tuple[torch.Tensor, torch.Tensor]:
    """Muon's first step on the step's mean gradient, on one device: (momentum, parameter)."""
    g = torch.full((1, 1), GRADIENT)
    momentum = torch.zeros(1, 1).lerp_(g, 1 - BETA)
    blend = g.clone().lerp_(momentum, BETA)  # Nesterov
    return momentum, torch.ones(1, 1) - LR * quintic(blend)


def rank_main(rank: int, store: str, out: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    lines = []
    for accumulation in (1, 2, 4):
        model = Feed()
        config = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": accumulation,
            "optimizer": {"type": "muon", "params": {"lr": LR, "momentum": BETA, "torch_adam": True}},
            # stage 3 refuses Muon with reduce_scatter on
            "zero_optimization": {"stage": 3, "reduce_scatter": False},
            "gradient_clipping": 0.0,
        }
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        for _ in range(accumulation):
            engine.backward(engine(torch.full((1, 1), GRADIENT)))
            engine.step()  # DeepSpeed steps its optimizer at the accumulation boundary only
        momentum = safe_get_full_optimizer_state(engine.module.p0, "momentum_buffer")
        param = safe_get_full_fp32_param(engine.module.p0)
        lines.append((accumulation, momentum, param))
    if rank == 0:
        torch.save(lines, out)
    dist.destroy_process_group()


def main() -> int:
    with tempfile.TemporaryDirectory() as where:
        out = str(Path(where, "result.pt"))
        mp.spawn(rank_main, args=(str(Path(where, "store")), out), nprocs=2)
        lines = torch.load(out)
    momentum, param = expected()
    print(f"deepspeed {deepspeed.__version__}, ZeRO stage 3, Muon, 2 ranks, p0 [1, 1] at 1, one step at lr {LR}")
    print(f"  every rank's gradient {GRADIENT} in every micro-batch; the step's mean gradient {GRADIENT}")
    print(f"  expected momentum {float(momentum)!r}, p0 {float(param)!r}")
    wrong = {}
    for accumulation, got_momentum, got in lines:
        off = float((got_momentum - momentum).abs().max())
        off_param = float((got - param).abs().max())
        wrong[accumulation] = off > 0 or off_param > 1e-6
        print(
            f"  accumulation {accumulation}: momentum {float(got_momentum)!r}, p0 {float(got)!r} "
            f"(moved {1 - float(got):.6f}, expected {1 - float(param):.6f}): max|diff| momentum {off:.3g}, p0 {off_param:.3g}"
        )
    shown = not wrong[1] and wrong[2] and wrong[4]
    verdict = "wrong with accumulation 2 and 4, right with 1" if shown else "not shown"
    print(f"verdict: {verdict}: stage 3 runs Muon once per micro-batch, not once per step")
    return 0 if shown else 1


if __name__ == "__main__":
    sys.exit(main())
