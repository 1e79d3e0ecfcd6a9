"""DeepSpeed 0.18.9's Muon at ZeRO stages 1 and 2 with ``reduce_scatter`` on, its default,
orthogonalizes a matrix that straddles two ranks' partitions from a gradient that is reduced only
on the rank's own part: the rest of the matrix holds this rank's own gradient, divided by the
world size but never summed with the other rank's. Its momentum and its step are then wrong.

Run: ``PYTHONPATH=/tmp/ds-old python examples/findings/deepspeed_0_18_muon_reduce_scatter.py``
(deepspeed and torch only; it starts its own 2 ranks on the CPU over gloo; exits 0 while it shows
the finding, 1 once it is gone).

Why: with ``reduce_scatter`` on, ``average_tensor`` sends each slice of a gradient to the rank
that owns that slice (``allreduce_no_retain(..., rank=dst)``, a ``dist.reduce``), so a rank's
copy of a straddling matrix's gradient is the mean on its own slice only. ``get_flat_partition``
then runs ``muon_update`` on the whole matrix on every rank, and keeps the whole matrix's
momentum, so each rank orthogonalizes another mixture. With ``reduce_scatter`` off the gradient is
all-reduced and the step is right. A bug in DeepSpeed, fixed in 0.19.3, where a split Muon
matrix is all-reduced whatever ``reduce_scatter`` says (deepspeedai/DeepSpeed#8141).

The case: a ``[1, 3]`` matrix (partitions of 2 elements at 2 ranks, so elements 0–1 are rank 0's
and element 2 is rank 1's), one step at lr 0.02, rank 0's gradient ``[1/8, 1/8, 1/8]`` and rank
1's ``[1/8, 1/8, -1/8]``: the mean is ``[1/8, 1/8, 0]``.
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
from deepspeed.utils import logger

# No shared-memory op built at start-up: a table that answers False for every op (0.18 indexes
# it, so an empty one raises KeyError: 'deepspeed_shm_comm').
deepspeed.ops.__compatible_ops__ = defaultdict(bool)
torch._dynamo.config.disable = True  # DeepSpeed's Muon is torch.compile'd; eager is enough here
logger.setLevel(logging.WARNING)
warnings.filterwarnings("ignore", category=FutureWarning)  # torch's on DeepSpeed's all_gather_into_tensor

LR = 0.02
BETA = 0.95
GRADIENTS = ([[1 / 8, 1 / 8, 1 / 8]], [[1 / 8, 1 / 8, -1 / 8]])  # rank 0's and rank 1's


class Feed(torch.nn.Module):
    """One matrix whose gradient is exactly the coefficient tensor fed to it."""

    def __init__(self) -> None:
        super().__init__()
        self.p0 = torch.nn.Parameter(torch.ones(1, 3))
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
    """Muon's first step on the mean gradient, on one device: (momentum, parameter)."""
    g = (torch.tensor(GRADIENTS[0]) + torch.tensor(GRADIENTS[1])) / 2
    momentum = torch.zeros(1, 3).lerp_(g, 1 - BETA)
    blend = g.clone().lerp_(momentum, BETA)  # Nesterov
    return momentum, torch.ones(1, 3) - LR * quintic(blend)


def rank_main(rank: int, store: str, out: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    lines = []
    for stage, reduce_scatter in ((1, True), (2, True), (1, False), (2, False)):
        model = Feed()
        config = {
            "train_micro_batch_size_per_gpu": 1,
            "optimizer": {"type": "muon", "params": {"lr": LR, "momentum": BETA, "torch_adam": True}},
            "zero_optimization": {"stage": stage, "reduce_scatter": reduce_scatter},
            "gradient_clipping": 0.0,
        }
        engine, zero, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        engine.backward(engine(torch.tensor(GRADIENTS[rank])))
        # Before 0.19 ZeRO 1–2 all-gather into views made by split(), which torch refuses to
        # write in place in grad mode; a training loop steps under no_grad() for the same reason.
        with torch.no_grad():
            engine.step()
        # Stages 1–2 keep Muon's momentum as a flat buffer of the whole matrices in the rank's
        # partition, here the whole [1, 3] matrix on both ranks.
        buffer = zero.optimizer.state[zero.single_partition_of_fp32_groups[0]]["momentum_buffer"]
        param = deepspeed.utils.safe_get_full_fp32_param(engine.module.p0)
        momenta = [torch.empty(3) for _ in range(2)]
        dist.all_gather(momenta, buffer[:3].contiguous())
        lines.append((stage, reduce_scatter, momenta, param))
    if rank == 0:
        torch.save(lines, out)
    dist.destroy_process_group()


def main() -> int:
    with tempfile.TemporaryDirectory() as where:
        out = str(Path(where, "result.pt"))
        mp.spawn(rank_main, args=(str(Path(where, "store")), out), nprocs=2)
        lines = torch.load(out)
    momentum, param = expected()
    print(f"deepspeed {deepspeed.__version__}, ZeRO stages 1 and 2, Muon, 2 ranks, p0 [1, 3], one step at lr {LR}")
    print(f"  gradients: rank 0 {GRADIENTS[0][0]}, rank 1 {GRADIENTS[1][0]}; mean {[1 / 8, 1 / 8, 0.0]}")
    print(f"  expected momentum {momentum.flatten().tolist()}")
    print(f"  expected p0       {param.flatten().tolist()}")
    wrong = {}
    for stage, reduce_scatter, momenta, got in lines:
        off = max(float((m - momentum.flatten()).abs().max()) for m in momenta)
        off_param = float((got - param).abs().max())
        wrong[stage, reduce_scatter] = off > 0 or off_param > 1e-6
        print(f"  stage {stage}, reduce_scatter {reduce_scatter}:")
        for r, m in enumerate(momenta):
            print(f"    rank {r}'s momentum {m.tolist()}")
        print(f"    p0 {got.flatten().tolist()}: max|diff| momentum {off:.3g}, p0 {off_param:.3g}")
    shown = all(wrong[s, True] and not wrong[s, False] for s in (1, 2))
    verdict = "wrong with reduce_scatter on, right with it off" if shown else "not shown"
    print(f"verdict: {verdict}: a straddling Muon matrix is orthogonalized from a partly reduced gradient")
    return 0 if shown else 1


if __name__ == "__main__":
    sys.exit(main())
