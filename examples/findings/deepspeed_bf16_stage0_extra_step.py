"""DeepSpeed 0.19.8 at ZeRO stage 0 with bf16 steps its optimizer once, on zero gradients, when it
is built: AdamW's step count starts at 1, so its bias correction is off from the first real step
on, and decoupled weight decay shrinks every parameter once before training starts.

Run: ``python examples/findings/deepspeed_bf16_stage0_extra_step.py`` (deepspeed and torch only,
one process on the CPU; exits 1 while the finding holds, 0 once it is gone).

Stage 0 with ``"bf16": {"enabled": true}`` wraps the optimizer in ``FP16_UnfusedOptimizer``, whose
constructor calls ``initialize_optimizer_states()``: it sets every gradient to zeros and calls
the wrapped optimizer's ``step()``. For ``torch.optim.AdamW`` that is a real step: ``state["step"]``
becomes 1 and ``p *= 1 - lr * weight_decay``. After one training step the state says 2 steps,
and the update is ``lr · 0.744`` instead of ``lr`` (β2 = 0.999: bias corrections of step 2 on a
first moment of one step). Stages 1–3, and stage 0 in float32, step once, as expected.
muongate's engine gate found it (``stage 0 adamw, bfloat16, p0[1]``: 0.0051 off after one step
at lr 0.02); DeepSpeed's Muon at stage 0 with bf16 shows the same through its auxiliary AdamW and
its decay. A bug in DeepSpeed.
"""

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")

import deepspeed
import deepspeed.ops
import torch

deepspeed.ops.__compatible_ops__ = {}  # no shared-memory op built at start-up (inference only)


def one_step(stage: int, bf16: bool) -> tuple[float, float, float]:
    """(state step, the parameter's change, what torch's AdamW alone changes it by) after one step."""
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "adamw", "params": {"lr": 0.02, "weight_decay": 0.0, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
        "gradient_clipping": 0.0,
        "bf16": {"enabled": bf16},
    }
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    engine.backward(engine(torch.ones(1, 1, dtype=torch.bfloat16 if bf16 else torch.float32)).float().sum())
    engine.step()
    inner = optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer
    step = max(float(s["step"]) for s in inner.state.values())
    weight = float(engine.module.weight.float().item())
    alone = torch.nn.Parameter(torch.ones(1))
    plain = torch.optim.AdamW([alone], lr=0.02, weight_decay=0.0)
    alone.grad = torch.ones(1)
    plain.step()
    return step, 1.0 - weight, 1.0 - float(alone.item())


def main() -> int:
    wrong = False
    for stage, bf16 in ((0, False), (0, True), (1, True)):
        step, change, expected = one_step(stage, bf16)
        name = "bf16" if bf16 else "float32"
        print(
            f"deepspeed {deepspeed.__version__}, stage {stage}, {name}: after one step the state counts {step:g} "
            f"step(s); the weight moved {change:.6f} (torch's AdamW alone: {expected:.6f})"
        )
        wrong = wrong or step != 1
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
