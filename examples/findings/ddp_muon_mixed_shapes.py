"""Keller Jordan's ``muon-optimizer`` 0.1.0, ``pytorch-optimizer`` 4.1.0's ``DistributedMuon`` and
``optimuon`` 0.1.1's ``Muon(distributed=True)`` cannot step Muon matrices of different shapes on
gloo (torch 2.13).

Run: ``torchrun --standalone --nproc-per-node 2 examples/findings/ddp_muon_mixed_shapes.py [keller|pytorch_optimizer|optimuon]``
(only torch and the package; exits 1 while the finding holds, 0 once it is gone).

All three deal the Muon matrices out to the ranks of the default group and hand the results round
with one ``dist.all_gather(params[i : i + world], params[i + rank])`` per ``world`` matrices:
the gather's output list holds *other* matrices, each of its own shape, and the input is
this rank's. torch's ``all_gather`` needs every tensor of one size; gloo raises
``ProcessGroupGloo::allgather: invalid tensor size``. Here: DDP-style replicated weights
``[4, 4]`` and ``[1, 7]`` on 2 ranks. Every model whose hidden matrices are not all of one
shape is affected on gloo (MuonWithAuxAdam sorts them by size, which groups equal shapes
but does not make the ``world`` neighbours equal). A bug in the packages' DDP path; not
tried on NCCL here (no two GPUs were lent).
"""

import sys

import torch
import torch.distributed as dist


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 4)), torch.nn.Parameter(torch.randn(1, 7))]
    for p in params:
        p.grad = torch.randn_like(p)
    which = sys.argv[1] if len(sys.argv) > 1 else "keller"
    if which == "keller":
        from muon import MuonWithAuxAdam

        opt = MuonWithAuxAdam([{"params": params, "use_muon": True}])
    elif which == "optimuon":
        from optimuon import Muon

        opt = Muon(params, distributed=True)
    else:
        from pytorch_optimizer import DistributedMuon

        opt = DistributedMuon([{"params": params, "use_muon": True}], foreach=False)
    try:
        opt.step()
    except Exception as e:  # the finding is what the collective raises
        print(f"rank {rank}: {which} step failed: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
        return 1
    print(f"rank {rank}: {which} step completed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
