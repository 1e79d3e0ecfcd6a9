"""DeepSpeed 0.19.8's per-head Muon (``"per_head_muon": true``) is silently dropped at ZeRO stage 0
and at stages 1 and 2 with ``"parameter_alignment": true``: the attention projections it tagged
step with Newton–Schulz on the whole matrix, with no warning, while stages 1 to 3 on their
default paths orthogonalize each head.

Run: ``python examples/findings/deepspeed_per_head_muon_dropped.py`` (deepspeed and torch only, one
process on the CPU; exits 1 while the finding holds, 0 once it is gone).

``set_optimizer_flags`` tags a ``q_proj`` of ``[heads · head_dim, hidden]`` with
``muon_num_heads``, and ``muon_update(…, num_heads=…)`` orthogonalizes each head on its own. Three
call sites of ``muon_update`` do not pass ``num_heads``: the stage-0 step
(``runtime/zero/muon/muon_optimizer.py``, ``MuonWithAuxAdam.step``), the stage-1/2 path taken
with parameter alignment (``stage_1_and_2.py``, ``get_flat_partition``) and the bf16 optimizer's
(``bf16_optimizer.py``); the default stage-1/2 path (``_get_flat_partition_unpadded``) and stage 3
pass it. This script takes one step at lr 1 on a ``q_proj`` of 4 heads of 8 rows and sets the
update DeepSpeed applied against per-head and whole-matrix Newton–Schulz written out here (bf16
quintic, Keller Jordan's coefficients, as DeepSpeed's ``ns_method="standard"``). A bug in DeepSpeed.
"""

import os
import sys
import types

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29534")

import deepspeed
import deepspeed.ops
import torch

deepspeed.ops.__compatible_ops__ = {}  # no shared-memory op built at start-up (inference only)
torch._dynamo.config.disable = True  # DeepSpeed compiles muon_update; eager is what the CPU runs

HEADS, HEAD_DIM, HIDDEN, BETA = 4, 8, 12, 0.95


class Attention(torch.nn.Module):
    """A model with the config per-head Muon reads its head counts from, and two odd-sized
    matrices, which parameter alignment pads."""

    def __init__(self) -> None:
        super().__init__()
        self.config = types.SimpleNamespace(
            num_attention_heads=HEADS, num_key_value_heads=HEADS, head_dim=HEAD_DIM, hidden_size=HIDDEN
        )
        self.q_proj = torch.nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.mlp = torch.nn.Linear(3, 3, bias=False)
        self.out = torch.nn.Linear(2, 2, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q_proj(x).square().mean() + self.mlp(x[:, :3]).square().mean() + self.out(x[:, :2]).square().mean()


def newton_schulz(g: torch.Tensor) -> torch.Tensor:
    """Five bf16 quintic iterations of Keller Jordan's, on each matrix of ``g`` ([..., rows, cols]), in bf16."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.bfloat16()
    tall = x.size(-2) > x.size(-1)
    x = x.mT if tall else x
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(5):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if tall else x


def expected(w0: dict[str, torch.Tensor], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head and whole-matrix Muon updates of ``q_proj`` after one step from zero momentum."""
    model = Attention()
    model.load_state_dict(w0)
    model(x).backward()
    g = model.q_proj.weight.grad
    update = g.lerp(torch.zeros_like(g).lerp(g, 1 - BETA), BETA)  # Nesterov on the first momentum
    per_head = newton_schulz(update.view(HEADS, HEAD_DIM, HIDDEN)).reshape_as(g).float()  # a head's scale is 1
    whole = (newton_schulz(update) * (HEADS * HEAD_DIM / HIDDEN) ** 0.5).float()  # the scale in bf16, as DeepSpeed
    return per_head, whole


def applied(stage: int, align: bool, w0: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    model = Attention()
    model.load_state_dict(w0)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_clipping": 0.0,
        "optimizer": {
            "type": "muon",
            "params": {"lr": 1.0, "momentum": BETA, "weight_decay": 0.0, "ns_method": "standard",
                       "per_head_muon": True, "torch_adam": True},
        },
        "zero_optimization": {"stage": stage, **({"parameter_alignment": True} if align else {}),
                              **({"reduce_scatter": False} if stage == 3 else {})},
    }  # fmt: skip
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    engine.backward(engine(x))
    engine.step()
    p = engine.module.q_proj.weight
    after = p.detach().float() if stage == 0 else deepspeed.utils.safe_get_full_fp32_param(p)
    return w0["q_proj.weight"] - after


def main() -> int:
    torch.manual_seed(0)
    w0 = {k: v.clone() for k, v in Attention().state_dict().items()}
    x = torch.randn(5, HIDDEN)
    per_head, whole = expected(w0, x)
    dropped = False
    for stage, align in ((0, False), (1, False), (1, True), (2, True), (3, False)):
        update = applied(stage, align, w0, x)
        off_head, off_whole = (update - per_head).abs().max().item(), (update - whole).abs().max().item()
        which = "per-head" if off_head < off_whole else "whole-matrix"
        dropped = dropped or which == "whole-matrix"
        print(
            f"deepspeed {deepspeed.__version__}, stage {stage}{', parameter_alignment' if align else ''}: "
            f"q_proj stepped with {which} Newton-Schulz (max|diff| {off_head:.2e} from per-head, "
            f"{off_whole:.2e} from whole-matrix)"
        )
    return 1 if dropped else 0


if __name__ == "__main__":
    sys.exit(main())
