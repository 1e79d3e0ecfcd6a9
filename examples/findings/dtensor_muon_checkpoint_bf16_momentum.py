"""dtensor-muon 0.1.0 keeps a bf16 parameter's momentum in float32, and a checkpoint loaded back
turns that buffer into bf16 for good (torch 2.11, one H200; the package needs triton and CUDA).

Run: ``python examples/findings/dtensor_muon_checkpoint_bf16_momentum.py`` (only torch, triton
and ``dtensor-muon==0.1.0``; prints what it measures, exits 0).

``torch.optim.Optimizer.load_state_dict``, which DCP's ``set_optimizer_state_dict`` calls too,
casts every floating-point state tensor to its parameter's dtype. The package creates the buffer
in float32 (``zeros_like(grad, dtype=torch.float32)``) and does not restore that dtype after a
load. Its step then writes the float32 momentum back into the bf16 buffer (``copy_``) at every
step, so a run resumed from a checkpoint keeps a bf16 momentum where an uninterrupted one keeps
float32. Printed: the buffer's dtype before and after the load, and how far the resumed run's
buffer and parameter land from the uninterrupted run's after three steps.
"""

import torch
from dtensor_muon import Muon
from torch import nn


def muon(p: nn.Parameter) -> Muon:
    return Muon([{"params": [p], "algorithm": "muon"}], lr=0.02, wd=0.0, use_cautious_wd=False,
                orthogonalization_strategy="newton_schulz")  # fmt: skip


def main() -> None:
    torch.manual_seed(0)
    p0 = torch.randn(8, 8, device="cuda").bfloat16()
    grads = [torch.randn(8, 8, device="cuda").bfloat16() for _ in range(3)]

    straight = nn.Parameter(p0.clone())
    opt = muon(straight)
    for g in grads:
        straight.grad = g.clone()
        opt.step()

    resumed = nn.Parameter(p0.clone())
    first = muon(resumed)
    resumed.grad = grads[0].clone()
    first.step()
    saved = first.state[resumed]["momentum_buffer"].dtype
    second = muon(resumed)
    second.load_state_dict(first.state_dict())
    print(f"momentum_buffer of a bf16 parameter: {saved} before the checkpoint, "
          f"{second.state[resumed]['momentum_buffer'].dtype} after load_state_dict")  # fmt: skip
    for g in grads[1:]:
        resumed.grad = g.clone()
        second.step()
    buffers = opt.state[straight]["momentum_buffer"].float(), second.state[resumed]["momentum_buffer"].float()
    print(f"after 3 steps, resumed after the first against uninterrupted: momentum_buffer max|diff| "
          f"{(buffers[0] - buffers[1]).abs().max().item():.3g} "
          f"(dtype {second.state[resumed]['momentum_buffer'].dtype}), "
          f"parameter max|diff| {(straight - resumed).abs().max().item():.3g}")  # fmt: skip


if __name__ == "__main__":
    main()
