"""``pytorch-optimizer`` 4.1.0's ``NorMuon`` cannot step an FSDP2 parameter, where its ``Muon``
can (torch 2.13, gloo).

Run: ``torchrun --standalone --nproc-per-node 2 examples/findings/pytorch_optimizer_normuon_dtensor.py``
(only torch and ``pytorch-optimizer==4.1.0``; exits 1 while the finding holds, 0 once it is gone).

Its ``Muon`` says it "supports FSDP2 DTensor parameters with eager optimizer steps", and its
Newton–Schulz gathers a DTensor whole. ``NorMuon`` shares that Newton–Schulz, but then adds
``eps`` in place to the update's norm (``update.norm().add_(eps)``). On a DTensor that norm is
a pending reduction (``_NormPartial``), and DTensor refuses an in-place op that would change
its placement. Here: an ``nn.Linear(4, 4)`` weight under ``fully_shard`` on 2 ranks, one step
of each optimizer on the same gradient. ``NorMuon``'s docstring claims no DTensor support, so
this is a limit of the package, not a broken promise; muongate runs it on full copies, as DDP
would give it (``examples/pytorch_optimizer_adapter.py``).
"""

import os
import sys

import torch
import torch.distributed as dist
from pytorch_optimizer import Muon, NorMuon
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import distribute_tensor


def step(optimizer: type[torch.optim.Optimizer], mesh: object) -> str:
    torch.manual_seed(0)
    model = nn.Linear(4, 4, bias=False)
    fully_shard(model, mesh=mesh)
    model.weight.grad = distribute_tensor(torch.randn(4, 4), mesh, model.weight.placements)
    try:
        optimizer([{"params": [model.weight], "use_muon": True}], foreach=False).step()
    except Exception as e:
        return f"raised {type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return "stepped"


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    results = {name: step(opt, mesh) for name, opt in (("Muon", Muon), ("NorMuon", NorMuon))}
    for name, result in results.items():
        print(f"rank {rank}: {name} {result}", flush=True)
    dist.barrier()  # every rank has printed before any leaves: torchrun stops the rest once one exits non-zero
    dist.destroy_process_group()
    return 0 if results["NorMuon"] == "stepped" else 1


if __name__ == "__main__":
    # Leave without the interpreter's teardown: gloo's threads outlive destroy_process_group after
    # DTensor and can abort the job there (findings/torch_gloo_threads_outlive_destroy.py).
    code = main()
    sys.stdout.flush()
    os._exit(code)
