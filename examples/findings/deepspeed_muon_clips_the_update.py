"""DeepSpeed 0.19.8's gradient clipping, with its Muon at ZeRO stages 1 to 3, measures and clips
Muon's orthogonalized update instead of the gradient: ``get_global_grad_norm()`` reports the
norm of the update, and a step whose gradients are well under the clip threshold is scaled down.

Run: ``python examples/findings/deepspeed_muon_clips_the_update.py`` (deepspeed and torch only,
one process on the CPU; exits 1 while the finding holds, 0 once it is gone).

At stages 1 and 2, ``muon_update`` runs while the gradients are reduced into the flat partition
(``get_flat_partition``), and at stage 3 before the partitions are stepped, so the buffers the
optimizer's ``unscale_and_clip_grads`` takes the norm of, and divides, already hold the
orthogonalized update (about ``√min(rows, cols)`` times the lr scale in norm, whatever the
gradient's size). ``"gradient_clipping"`` is 1.0 unless a configuration says otherwise, so every
Muon step of such a model is divided by that norm. The script takes one step at lr 1 on one
``[16, 8]`` Muon matrix whose gradient has a norm of 0.05 and sets it against the same step with
clipping off: clipping a gradient of norm 0.05 to 1.0 must change nothing. Stage 0 clips the
gradient (``clip_grad_norm_``) before Muon runs and is not affected.
"""

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29541")

import deepspeed
import deepspeed.ops
import torch

deepspeed.ops.__compatible_ops__ = {}  # no shared-memory op built at start-up (inference only)
torch._dynamo.config.disable = True  # DeepSpeed compiles muon_update; eager is what the CPU runs


class Feed(torch.nn.Module):
    """One Muon matrix whose gradient is exactly ``c``: the loss is ``(w * c).sum()``."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(w.clone())

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        return (self.w * c).sum()


def step(stage: int, clip: float, w0: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, float | None]:
    """The update one step applied (``w0 - w``) and the norm DeepSpeed reports."""
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_clipping": clip,
        "optimizer": {"type": "muon", "params": {"lr": 1.0, "momentum": 0.95, "weight_decay": 0.0, "torch_adam": True}},
        "zero_optimization": {"stage": stage, **({"reduce_scatter": False} if stage == 3 else {})},
    }
    model = Feed(w0)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    engine.backward(engine(c))
    with torch.no_grad():
        engine.step()
    p = engine.module.w
    after = p.detach().float() if stage == 0 else deepspeed.utils.safe_get_full_fp32_param(p)
    norm = engine.get_global_grad_norm()
    return w0 - after, None if norm is None else float(norm)


def main() -> int:
    torch.manual_seed(0)
    w0, c = torch.randn(16, 8), torch.randn(16, 8)
    c *= 0.05 / c.norm()  # the gradient's norm, well under the threshold
    shrunk = False
    for stage in (0, 1, 2, 3):
        free, _ = step(stage, 0.0, w0, c)
        clipped, reported = step(stage, 1.0, w0, c)
        ratio = (clipped.norm() / free.norm()).item()
        shrunk = shrunk or ratio < 0.99
        shown = "None" if reported is None else f"{reported:.4f}"
        print(
            f"deepspeed {deepspeed.__version__}, stage {stage}: gradient norm {c.norm():.4f}, clip 1.0; "
            f"reported norm {shown}; update norm {free.norm():.4f} unclipped, {clipped.norm():.4f} clipped "
            f"(x{ratio:.4f})"
        )
    return 1 if shrunk else 0


if __name__ == "__main__":
    sys.exit(main())
