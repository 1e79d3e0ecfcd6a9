"""muon-fsdp2 0.3.0 cannot step a matrix whose rows FSDP2 splits unevenly (torch 2.13, gloo).

Run: ``torchrun --standalone --nproc-per-node 2 examples/findings/muon_fsdp2_uneven_shards.py``
(only torch and ``muon-fsdp2==0.3.0``; exits 1 while the finding holds, 0 once it is gone).

An ``nn.Linear(4, 3)`` weight ``[3, 4]`` under ``fully_shard`` on 2 ranks: rank 0 holds 2
rows, rank 1 holds 1 (``torch.chunk``, as FSDP2 shards). ``Fsdp1dWork.start`` gathers the
shards into buffers shaped like the *owner's* shard (``torch.zeros_like(grad.to_local())``
for every rank), so the gather's sizes disagree between ranks. Seen: rank 1 aborts
(SIGABRT, gloo's "op.preamble.length <= op.nbytes. 32 vs 16. Received data size doesn't
match expected size"), while rank 0 prints "step completed"; torchrun then ends the job
with exit code 1. Every FSDP2 matrix whose row count
the world size does not divide, and every one with fewer rows than ranks (empty shards),
is affected. A bug in the package: FSDP2 shards unevenly by design.
"""

import sys

import torch
import torch.distributed as dist
from muon_fsdp2 import Muon
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(4, 3, bias=False)
    fully_shard(model, mesh=init_device_mesh("cpu", (2,)))
    print(f"rank {rank}: weight {tuple(model.weight.shape)}, local rows {model.weight.to_local().shape[0]}", flush=True)
    model(torch.randn(2, 4)).square().sum().backward()
    opt = Muon([{"params": list(model.parameters()), "use_muon": True}])
    try:
        opt.step()
    except Exception as e:  # the finding is whatever the collective raises
        print(f"rank {rank}: step failed: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
        return 1
    print(f"rank {rank}: step completed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
