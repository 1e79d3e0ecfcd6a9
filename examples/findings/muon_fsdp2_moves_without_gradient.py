"""muon-fsdp2 0.3.0 moves a Muon parameter that has no gradient (torch 2.13, gloo).

Run: ``torchrun --standalone --nproc-per-node 1 examples/findings/muon_fsdp2_moves_without_gradient.py``
(only torch and ``muon-fsdp2==0.3.0``; exits 1 while the behaviour holds, 0 once it is gone).

``Muon.step`` gives every parameter whose ``grad`` is ``None`` a zero gradient ("Force
synchronization", its comment says) and steps it like the others: its weight decay applies,
and from the second step on its momentum moves it too. ``torch.optim`` optimizers, and
``reference.Muon`` after them, leave a parameter without a gradient exactly as it was. By
design in the package (it keeps every rank's gathers the same when one rank has no
gradient), but a different result: a parameter that is frozen for a step, or unused on it,
still changes. Here: one FSDP2 weight, weight decay 0.1, two steps, a gradient on the first only.
"""

import os
import sys

import torch
import torch.distributed as dist
from muon_fsdp2 import Muon
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def main() -> int:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Linear(4, 4, bias=False)
    fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
    opt = Muon([{"params": list(model.parameters()), "use_muon": True, "weight_decay": 0.1}])
    model(torch.randn(2, 4)).square().sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    before = model.weight.full_tensor().clone()
    assert model.weight.grad is None
    opt.step()  # no gradient on this step
    moved = (model.weight.full_tensor() - before).abs().max().item()
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
