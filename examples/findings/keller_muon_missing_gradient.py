"""Keller Jordan's ``muon-optimizer`` 0.1.0 raises on a Muon parameter without a gradient
(torch 2.13, gloo, one rank).

Run: ``torchrun --standalone --nproc-per-node 1 examples/findings/keller_muon_missing_gradient.py``
(only torch and ``muon-optimizer==0.1.0``; exits 1 while the finding holds, 0 once it is gone).

``MuonWithAuxAdam.step`` hands every Muon parameter's ``p.grad`` to ``muon_update``, which
calls ``momentum.lerp_(grad, …)``: for a parameter with no gradient (frozen this step, or
unused by the batch, as an MoE expert without tokens) that is
``TypeError: lerp_() received an invalid combination of arguments - got (NoneType, float)``.
torch's optimizers, and muongate's reference, skip such a parameter. A bug in the package.
"""

import sys

import torch
import torch.distributed as dist
from muon import MuonWithAuxAdam


def main() -> int:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    used, idle = torch.nn.Parameter(torch.randn(4, 4)), torch.nn.Parameter(torch.randn(4, 4))
    used.grad = torch.randn(4, 4)
    opt = MuonWithAuxAdam([{"params": [used, idle], "use_muon": True}])
    try:
        opt.step()
    except TypeError as e:
        print(f"step failed: TypeError: {str(e).splitlines()[0]}", flush=True)
        return 1
    print("step completed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
