"""DeepSpeed 0.19.8's ``safe_get_full_optimizer_state`` cannot read the AdamW state of its own Muon
at ZeRO stages 1 and 2: for every parameter of the Muon optimizer's AdamW half (vectors,
embeddings, heads) it raises ``ValueError: exp_avg not found in optimizer state fragment``,
though the optimizer holds that state.

Run: ``python examples/findings/deepspeed_muon_adamw_state_unreadable.py`` (deepspeed and torch
only, one process on the CPU; exits 1 while the finding holds, 0 once it is gone).

ZeRO 1–2 step the optimizer one parameter group at a time (``_optimizer_step``) and, after the
first group's step, link every group's state into the parameters' fragments once
(``_lazy_init_hp_params_optimizer_state``). A Muon model's first group is its Muon half, so the
AdamW half has no state yet when it is linked, and is never linked again. With
``"type": "adamw"`` (one group) the state reads. Linking again after the step
(``_hp_optimizer_states_linked = False``, then the same method) makes it readable, which is what
muongate's adapter does before it reads. A bug in DeepSpeed's state API, not in its arithmetic:
the state itself is right.
"""

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29535")

import deepspeed
import deepspeed.ops
import torch
from deepspeed.utils import safe_get_full_optimizer_state

deepspeed.ops.__compatible_ops__ = {}  # no shared-memory op built at start-up (inference only)
torch._dynamo.config.disable = True  # DeepSpeed's Muon is torch.compile'd; eager is enough here


def read(optimizer: str, stage: int) -> str:
    """What ``safe_get_full_optimizer_state`` gives for a bias's ``exp_avg`` after one step."""
    model = torch.nn.Linear(2, 2)  # its weight goes to Muon, its bias to Muon's AdamW
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": optimizer, "params": {"lr": 0.02, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
        "gradient_clipping": 0.0,
    }
    engine, zero, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    engine.backward(engine(torch.ones(1, 2)).sum())
    engine.step()
    held = any("exp_avg" in s for s in zero.optimizer.state.values())
    try:
        value = safe_get_full_optimizer_state(engine.module.bias, "exp_avg")
    except ValueError as e:
        return f"ValueError: {e} (the optimizer holds exp_avg: {held})"
    return f"{value.tolist()}"


def main() -> int:
    wrong = False
    for stage in (1, 2):
        for optimizer in ("adamw", "muon"):
            got = read(optimizer, stage)
            print(f"deepspeed {deepspeed.__version__}, stage {stage}, {optimizer}: the bias's exp_avg: {got}")
            wrong = wrong or got.startswith("ValueError")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
