"""``torch.optim.Adam`` with weight decay (L2: ``grad.add(param, alpha=wd)``) on a bfloat16
parameter gives other bits on a shard than on the whole tensor, on the CPU (torch 2.13).

Run: ``python examples/findings/torch_adam_l2_bf16_shard_bits.py`` (torch only; exits 1 while
the finding holds, 0 once it is gone).

FSDP2 gives each rank rows of a parameter (``torch.chunk`` on dim 0: a 7×5 weight on two ranks
is rows 0–3 and 4–6) and ``torch.optim.Adam`` steps each rank's piece on its own. Elementwise
arithmetic should give every element the same bits wherever it sits, but the CPU's bf16
``add(…, alpha=…)`` rounds differently in a loop's vectorised body and in its scalar tail, so
an element's result depends on where it falls in its piece. The gates found it as
``adamw:adam_for_loop`` / ``one_step`` under ``--impl gates.examples.torch_adam:adam_for_loop``:
``w0[7, 5] bfloat16 · world 2 · 1 step · weight_decay=0.1``, ``exp_avg`` 1 ULP off on both ranks.
This script steps the whole tensor and the two pieces on one process, which is exactly what
the ranks do. ``torch.optim.AdamW`` (decoupled decay, ``param.mul_``) and fp32 parameters are
bitwise. A property of torch's CPU kernels, not of FSDP2: a finding about torch, which the
harness shows as a difference from the one-device result.
"""

import sys

import torch


def step(p0: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    p = p0.clone().requires_grad_()
    opt = torch.optim.Adam([p], lr=1e-3, weight_decay=0.1, foreach=False)
    p.grad = g.clone()
    opt.step()
    return p.detach(), opt.state[p]["exp_avg"]


def main() -> int:
    torch.manual_seed(0)
    p0 = torch.randn(7, 5).bfloat16()
    g = torch.randn(7, 5).bfloat16()
    whole_p, whole_m = step(p0, g)
    pieces = [step(a, b) for a, b in zip(p0.chunk(2), g.chunk(2), strict=True)]
    sharded_p = torch.cat([p for p, _ in pieces])
    sharded_m = torch.cat([m for _, m in pieces])
    differ = int((whole_m.view(torch.int16) != sharded_m.view(torch.int16)).sum())
    differ += int((whole_p.view(torch.int16) != sharded_p.view(torch.int16)).sum())
    print(f"torch {torch.__version__}: {differ} of {2 * p0.numel()} elements of exp_avg and the parameter differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
