"""DeepSpeed 0.19.8 rounds its Muon's momentum to bf16 for a bf16 model at ZeRO stages 1–3, where
its optimizer on one device, on the float32 masters, keeps it in float32.

Run: ``torchrun --nproc-per-node 2 examples/findings/deepspeed_muon_bf16_momentum.py`` (deepspeed
and torch only, CPU and gloo; exits 1 while the momentum is rounded to bf16, 0 once it is not).
Stage 3 rounds it in its all-gather of the momenta, so it needs two ranks to show.

By design: at stages 1–2 the flat momentum buffer follows the gradient's dtype, so that
``muon_update``'s ``lerp_`` takes both (``_muon_momentum_buffer`` says why); at stage 3 it is
stored in float32 but all-gathered in the communication dtype, bf16 unless
``"communication_data_type": "fp32"``. The momentum is then rounded to bf16 at every step, which its one-device optimizer does not do, so muongate's engine
gate, which judges DeepSpeed's Muon against that optimizer, fails its bf16 cells of stages 1–3
on ``momentum_buffer`` at the first step. The adapter declares it as a difference.
"""

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import deepspeed.ops
import torch
from deepspeed.utils import safe_get_full_optimizer_state

deepspeed.ops.__compatible_ops__ = {}  # no shared-memory op built at start-up (inference only)
torch._dynamo.config.disable = True  # DeepSpeed's Muon is torch.compile'd; eager is enough here


def momentum(stage: int) -> torch.Tensor:
    """A bf16 matrix's Muon momentum after one step at ``stage``, whose gradient is all ones: in
    float32 arithmetic, ``lerp(0, 1, 1 - 0.95)`` is 0.05 (0.0500000007)."""
    model = torch.nn.Linear(4, 4, bias=False)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "muon", "params": {"lr": 0.02, "torch_adam": True}},
        "zero_optimization": {"stage": stage, **({"reduce_scatter": False} if stage == 3 else {})},
        "gradient_clipping": 0.0,
        "bf16": {"enabled": True},
    }
    engine, zero, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    engine.backward(engine(torch.ones(1, 4, dtype=torch.bfloat16)).float().sum())
    engine.step()
    if stage == 3:
        return safe_get_full_optimizer_state(engine.module.weight, "momentum_buffer")
    return next(s["momentum_buffer"] for s in zero.optimizer.state.values() if "momentum_buffer" in s)


def main() -> int:
    rounded = False
    for stage in (1, 2, 3):
        m = momentum(stage)
        value = float(m.flatten()[0])
        rounded = rounded or value != float(torch.tensor(0.05))
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"deepspeed {deepspeed.__version__}, stage {stage}, bf16 model: Muon momentum {value!r} ({m.dtype})")
    return 1 if rounded else 0


if __name__ == "__main__":
    sys.exit(main())
