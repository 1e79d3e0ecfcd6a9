"""pytorch-optimizer 4.1.0's ``DistributedMuon`` moves a Muon parameter that has no gradient
(torch 2.13, gloo).

Run: ``torchrun --standalone --nproc-per-node 1 examples/findings/distributed_muon_moves_without_gradient.py``
(only torch and ``pytorch-optimizer==4.1.0``; exits 1 while the behaviour holds, 0 once it is gone).

``DistributedMuon.init_group`` gives every parameter whose ``grad`` is ``None`` a zero
gradient (``p.grad = torch.zeros_like(p)``), and the step then applies its weight decay to
it. ``torch.optim`` optimizers, its own single-device ``Muon`` and ``reference.Muon`` leave a
parameter without a gradient as it was. By design in the package (every rank takes part in
every gather), but a different result: a weight frozen or unused for a step still changes.
Here: one weight, weight decay 0.1, two steps, a gradient on the first only.
"""

import os
import sys

import torch
import torch.distributed as dist
from pytorch_optimizer import DistributedMuon
from torch import nn


def main() -> int:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Linear(4, 4, bias=False)
    opt = DistributedMuon([{"params": list(model.parameters()), "use_muon": True}], weight_decay=0.1, foreach=False)
    model(torch.randn(2, 4)).square().sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    before = model.weight.detach().clone()
    assert model.weight.grad is None
    opt.step()  # no gradient on this step
    moved = (model.weight.detach() - before).abs().max().item()
    print(f"largest change of a weight without a gradient: {moved:.3g}", flush=True)
    dist.barrier()  # every rank has printed before any leaves: torchrun stops the rest once one exits non-zero
    dist.destroy_process_group()
    return 1 if moved else 0


if __name__ == "__main__":
    # Leave without the interpreter's teardown: gloo's threads outlive destroy_process_group after
    # DTensor and can abort the job there (findings/torch_gloo_threads_outlive_destroy.py).
    code = main()
    sys.stdout.flush()
    os._exit(code)
