"""``torch.optim.Muon`` normalizes a bf16 parameter's momentum buffer in place when Nesterov is
off (torch 2.13.0 on the CPU, and 2.11.0+cu130 on the GPU machine's CPU, the same figures): the
buffer it carries to the next step is no longer the momentum.

Run: ``python examples/findings/torch_muon_bf16_buffer_normalized.py`` (torch only; exits 1 while
the finding holds, 0 once it is gone).

With ``nesterov=False`` the step's update is the momentum buffer itself, and
``_zeropower_via_newtonschulz`` starts with ``ortho_grad = grad.bfloat16()`` then
``ortho_grad.div_(norm)``. For a float32 parameter ``bfloat16()`` makes a copy; for a bf16 one it
returns the buffer itself, which is divided by its norm in place. After one step from zero the
buffer should be ``lerp(0, g, 1 - momentum)``; here it is that divided by its norm. The step's own
update is unchanged (Newton–Schulz normalizes anyway); from the second step on, the momentum is
wrong. muongate's cause gate found it once the adapter declared bf16 parameters (their bf16
momentum a known difference): ``w[2, 2] bfloat16 · world 1 · 3 steps · nesterov=False``,
max|diff| 0.641 at lr 1. A bug in torch, on one device; it is the wrong variant the cause tiers
are calibrated against (``buffer_normalized``).
"""

import sys

import torch


def main() -> int:
    torch.manual_seed(0)
    wrong = False
    for dtype in (torch.float32, torch.bfloat16):
        for nesterov in (True, False):
            p = torch.nn.Parameter(torch.randn(4, 4, dtype=dtype))
            opt = torch.optim.Muon([p], lr=0.02, momentum=0.95, nesterov=nesterov, weight_decay=0.0)
            g = torch.randn(4, 4).to(dtype)
            p.grad = g.clone()
            opt.step()
            buf = opt.state[p]["momentum_buffer"]
            expected = torch.zeros_like(g).lerp_(g, 0.05)
            off = float((buf.float() - expected.float()).abs().max())
            name = str(dtype).removeprefix("torch.")
            print(f"torch {torch.__version__}: {name} parameter, nesterov={nesterov}: momentum buffer off by {off:g}")
            wrong = wrong or off > 0
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
