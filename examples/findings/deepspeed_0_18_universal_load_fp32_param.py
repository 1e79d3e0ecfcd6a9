"""DeepSpeed 0.18.9, at ZeRO stages 1 and 2, loads a universal checkpoint right but then reads the
wrong tensor as each parameter's float32 master: after ``load_checkpoint`` with
``"load_universal": true``, ``safe_get_full_fp32_param`` returns one of the parameter's AdamW
states, ``exp_avg`` or ``exp_avg_sq``, while the model holds the saved values.

Run: ``PYTHONPATH=/tmp/ds-old python examples/findings/deepspeed_0_18_universal_load_fp32_param.py``
(deepspeed and torch only; it trains and saves on 2 ranks of its own, converts with
``ds_to_universal``, and loads on 1 and on 2 ranks, on the CPU over gloo; exits 0 while it shows
the finding, 1 once it is gone).

Why: the universal load (``load_hp_checkpoint_state_from_checkpoint_dir``) copies the master into
the flat float32 partition, then ``map_to_flat_opt_states`` (``deepspeed/utils/tensor_fragment.py``)
builds one flat buffer per optimizer state key and, for each parameter, points its mapping's
``hp_fragment``, the float32 master's fragment, at its piece of that buffer, where the state's
fragment (``optim_fragment[key]``) was meant. After the last key the master's fragment is a view
of that key's state (the keys are a set, so ``exp_avg`` or ``exp_avg_sq`` from one process to the
next), and every read through the fragment API (``safe_get_full_fp32_param``; by the same
fragment ``safe_set_full_fp32_param`` would write into the state) meets the state instead of the
master. Training goes on from the right values: the step uses the flat partition and the state
buffers, not the fragments. A bug in DeepSpeed's state API, in every release up to 0.19.6;
0.19.7 assigns the fragment to ``optim_fragment[key]``. Stage 3 loads otherwise, and reads right.

The case: a ``[2, 3]`` matrix of ones, one AdamW step at lr 0.02, weight decay 0.1 and
DeepSpeed's defaults (betas 0.9, 0.999, eps 1e-8), rank 0's gradient ``1/8`` everywhere and
rank 1's ``[[3/8, -1/8, 1/8], [1/8, 5/8, -3/8]]``.
"""

import contextlib
import io
import logging
import os
import sys
import tempfile
import warnings
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import deepspeed.ops
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from deepspeed.checkpoint import ds_to_universal
from deepspeed.utils import logger, safe_get_full_fp32_param

# No shared-memory op built at start-up: a table that answers False for every op (0.18 indexes
# it, so an empty one raises KeyError: 'deepspeed_shm_comm').
deepspeed.ops.__compatible_ops__ = defaultdict(bool)
logger.setLevel(logging.ERROR)  # the load warns that no model-parallel unit was given
warnings.filterwarnings("ignore", category=FutureWarning)  # torch's on DeepSpeed's all_gather_into_tensor

LR = 0.02
DECAY = 0.1
GRADIENTS = ([[1 / 8] * 3] * 2, [[3 / 8, -1 / 8, 1 / 8], [1 / 8, 5 / 8, -3 / 8]])  # rank 0's and rank 1's


class Feed(torch.nn.Module):
    """One matrix whose gradient is exactly the coefficient tensor fed to it."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.p0 = torch.nn.Parameter(torch.full((2, 3), value))

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        return (self.p0 * c).sum()


def config(stage: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "adamw", "params": {"lr": LR, "weight_decay": DECAY, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
        "gradient_clipping": 0.0,
        "checkpoint": {"load_universal": True},  # read by load_checkpoint only
    }


def expected() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(parameter, exp_avg, exp_avg_sq) after torch's AdamW's step on the mean gradient, on one device."""
    p = torch.nn.Parameter(torch.ones(2, 3))
    adamw = torch.optim.AdamW([p], lr=LR, weight_decay=DECAY, betas=(0.9, 0.999), eps=1e-8, foreach=False)
    p.grad = (torch.tensor(GRADIENTS[0]) + torch.tensor(GRADIENTS[1])) / 2
    adamw.step()
    return p.detach(), adamw.state[p]["exp_avg"], adamw.state[p]["exp_avg_sq"]


def join(rank: int, world: int, store: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)


def train_and_save(rank: int, stage: int, where: str) -> None:
    join(rank, 2, f"{where}/store-save")
    model = Feed(1.0)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config(stage))
    engine.backward(engine(torch.tensor(GRADIENTS[rank])))
    # Before 0.19 ZeRO 1–2 all-gather into views made by split(), which torch refuses to write
    # in place in grad mode; a training loop steps under no_grad() for the same reason.
    with torch.no_grad():
        engine.step()
    engine.save_checkpoint(f"{where}/saved", tag="step1")
    dist.destroy_process_group()


def load(rank: int, world: int, stage: int, where: str) -> None:
    join(rank, world, f"{where}/store-load-{world}")
    model = Feed(0.0)  # another start, so that only the load can give it the saved values
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config(stage))
    engine.load_checkpoint(f"{where}/universal")
    module = engine.module.p0.detach().clone()
    master = safe_get_full_fp32_param(engine.module.p0)
    if rank == 0:
        torch.save((module, master), f"{where}/loaded-{world}.pt")
    dist.destroy_process_group()


def convert(where: str) -> None:
    args = SimpleNamespace(
        input_folder=f"{where}/saved/step1",
        output_folder=f"{where}/universal/step1",
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,  # a plain model carries no universal_checkpoint_info
    )
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        ds_to_universal.main(args)
    Path(where, "universal", "latest_universal").write_text("step1")


def main() -> int:
    param, exp_avg, exp_avg_sq = expected()
    print(f"deepspeed {deepspeed.__version__}, AdamW, p0 [2, 3] of ones, one step on 2 ranks at lr {LR}, decay {DECAY}")
    print(f"  expected p0         {[round(v, 7) for v in param.flatten().tolist()]}")
    print(f"  expected exp_avg    {[round(v, 7) for v in exp_avg.flatten().tolist()]}")
    print(f"  expected exp_avg_sq {[round(v, 7) for v in exp_avg_sq.flatten().tolist()]}")
    shown = True
    for stage in (1, 2):
        with tempfile.TemporaryDirectory() as where:
            mp.spawn(train_and_save, args=(stage, where), nprocs=2)
            convert(where)
            for world in (1, 2):
                mp.spawn(load, args=(world, stage, where), nprocs=world)
                module, master = torch.load(f"{where}/loaded-{world}.pt")
                off_module = float((module - param).abs().max())
                off_master = float((master - param).abs().max())
                # Each rank's fragment is a view of whichever key its own process's set gave last.
                pairs = zip(
                    master.flatten().tolist(), exp_avg.flatten().tolist(), exp_avg_sq.flatten().tolist(), strict=True
                )
                elementwise = [
                    "exp_avg" if abs(m - a) < 1e-9 else "exp_avg_sq" if abs(m - q) < 1e-9 else "neither"
                    for m, a, q in pairs
                ]
                print(f"  stage {stage}, universal checkpoint loaded on {world} rank(s):")
                print(f"    the model's p0: max|diff| {off_module:.3g} from the expected p0")
                print(f"    safe_get_full_fp32_param(p0) {[round(v, 7) for v in master.flatten().tolist()]}:")
                print(f"      max|diff| {off_master:.3g} from the expected p0; element by element its {elementwise}")
                shown = shown and off_module < 1e-6 and off_master > 0.5 and "neither" not in elementwise
    verdict = "the master read after a universal load is an AdamW state" if shown else "not shown"
    print(f"verdict: {verdict}; the model itself holds the saved values")
    return 0 if shown else 1


if __name__ == "__main__":
    sys.exit(main())
