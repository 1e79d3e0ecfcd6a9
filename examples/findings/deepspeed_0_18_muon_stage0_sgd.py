"""DeepSpeed 0.18.9's Muon at ZeRO stage 0 steps its matrices as plain SGD with weight decay: no
momentum, no orthogonalization, no state. Its ``MuonWithAuxAdam`` on one device does the same.

Run: ``PYTHONPATH=/tmp/ds-old python examples/findings/deepspeed_0_18_muon_stage0_sgd.py``
(deepspeed and torch only; it starts its own 2 ranks on the CPU over gloo; exits 0 while it shows
the finding, 1 once it is gone).

Why: ``MuonWithAuxAdam.step`` (``deepspeed/runtime/zero/muon/muon_optimizer.py``) gives a Muon
group ``p *= 1 - lr·wd`` and ``p -= lr·grad`` only, because ZeRO 1–3 are meant to have put Muon's
orthogonalized update in the gradient already (``get_flat_partition`` at stages 1–2,
``_apply_distributed_muon_update`` at stage 3). Stage 0 has no ZeRO optimizer, so nothing runs
Muon, and the engine takes ``"type": "muon"`` without a word. A bug in DeepSpeed, in every
release with Muon up to 0.19.6; 0.19.7 runs ``muon_update`` in ``step`` for a parameter that is
still a matrix, not a flat ZeRO partition.

The case: a ``[2, 2]`` matrix of ones, one step at lr 0.02 and weight decay 0.1, every rank's
gradient ``[[1/8, 0], [0, 1/4]]``.
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
from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam
from deepspeed.utils import logger

# No shared-memory op built at start-up: a table that answers False for every op (0.18 indexes
# it, so an empty one raises KeyError: 'deepspeed_shm_comm').
deepspeed.ops.__compatible_ops__ = defaultdict(bool)
torch._dynamo.config.disable = True  # DeepSpeed's Muon is torch.compile'd; eager is enough here
logger.setLevel(logging.WARNING)
warnings.filterwarnings("ignore", category=FutureWarning)  # torch's on DeepSpeed's all_gather_into_tensor

LR = 0.02
BETA = 0.95
DECAY = 0.1
GRADIENT = [[1 / 8, 0.0], [0.0, 1 / 4]]  # every rank's, so the mean gradient too


class Feed(torch.nn.Module):
    """One matrix whose gradient is exactly the coefficient tensor fed to it."""

    def __init__(self) -> None:
        super().__init__()
        self.p0 = torch.nn.Parameter(torch.ones(2, 2))
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


def expected() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Muon's momentum, Muon's parameter, plain SGD's parameter) after one step, on one device."""
    g = torch.tensor(GRADIENT)
    momentum = torch.zeros(2, 2).lerp_(g, 1 - BETA)
    blend = g.clone().lerp_(momentum, BETA)  # Nesterov
    decayed = torch.ones(2, 2) * (1 - LR * DECAY)
    return momentum, decayed - LR * quintic(blend), decayed - LR * g


def rank_main(rank: int, store: str, out: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    model = Feed()
    params = {"lr": LR, "momentum": BETA, "weight_decay": DECAY, "torch_adam": True}
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "muon", "params": params},
        "zero_optimization": {"stage": 0},
        "gradient_clipping": 0.0,
    }
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    engine.backward(engine(torch.tensor(GRADIENT)))
    engine.step()
    engine_state = sorted(optimizer.state.get(engine.module.p0, {}))
    engine_param = engine.module.p0.detach().clone()
    # Its optimizer on one device, grouped as the engine groups a Muon model.
    alone = torch.nn.Parameter(torch.ones(2, 2))
    alone.use_muon = True
    single = MuonWithAuxAdam([{"params": [alone], "use_muon": True, "lr": LR, "momentum": BETA, "weight_decay": DECAY}])
    alone.grad = torch.tensor(GRADIENT)
    single.step()
    single_state = sorted(single.state.get(alone, {}))
    if rank == 0:
        torch.save([("engine", engine_state, engine_param), ("MuonWithAuxAdam", single_state, alone.detach())], out)
    dist.destroy_process_group()


def main() -> int:
    with tempfile.TemporaryDirectory() as where:
        out = str(Path(where, "result.pt"))
        mp.spawn(rank_main, args=(str(Path(where, "store")), out), nprocs=2)
        lines = torch.load(out)
    momentum, muon, sgd = expected()
    print(f"deepspeed {deepspeed.__version__}, ZeRO stage 0, Muon, 2 ranks, p0 [2, 2] of ones, one step")
    print(f"  lr {LR}, weight decay {DECAY}, every rank's gradient {GRADIENT}")
    print(f"  expected (Muon): state ['momentum_buffer'] = {momentum.flatten().tolist()}")
    print(f"                   p0 {muon.flatten().tolist()}")
    print(f"  plain SGD with decay: p0 {sgd.flatten().tolist()}")
    shown = True
    for who, state, got in lines:
        off_muon = float((got - muon).abs().max())
        off_sgd = float((got - sgd).abs().max())
        print(f"  {who}: state {state}, p0 {got.flatten().tolist()}")
        print(f"    max|diff| against Muon {off_muon:.3g}, against plain SGD {off_sgd:.3g}")
        shown = shown and off_sgd == 0 and off_muon > 1e-3 and "momentum_buffer" not in state
    verdict = "both step the matrix as plain SGD with decay and keep no momentum" if shown else "not shown"
    print(f"verdict: {verdict}")
    return 0 if shown else 1


if __name__ == "__main__":
    sys.exit(main())
