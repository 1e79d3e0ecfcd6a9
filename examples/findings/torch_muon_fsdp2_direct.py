"""``torch.optim.Muon`` handed FSDP2's DTensor parameters directly, as a user hands it a model's
parameters (torch 2.13, gloo, CPU, 2 ranks).

Run: ``torchrun --standalone --nproc-per-node 2 examples/findings/torch_muon_fsdp2_direct.py``
(torch only; exits 1 while the finding holds, 0 once it is gone).

``fully_shard`` leaves each weight a row-sharded DTensor, and ``torch.optim.Muon`` runs its
Newton–Schulz on it through DTensor's own ops: the norm and every product are reduced across
the ranks, in another order than on one device. Two things follow:

* **another result** (a convention of running Muon through DTensor, not a bug): a ``[4, 4]``
  float32 weight comes out other than the same Muon on one device, in most elements
  (12 of 16, 7.8e-6 here; the gates saw up to 1e-2 on other cases). Bitwise claims cannot hold;
  ``examples/torch_muon.py:torch_muon`` (full copies) is bitwise.
* **a crash on a weight with fewer rows than ranks** (a bug in torch): a ``[1, 7]`` weight
  leaves rank 1 an empty piece, and the update's ``add_`` of the bf16 result (replicated) to
  the float32 parameter (sharded) fails: ``aten.add_.Tensor: in-place operations that require
  placement changes are not supported`` (the gates' run saw ``Sharding propagation failed for
  aten.add_.Tensor`` for the same step).
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import distribute_tensor


def step(shape: tuple[int, int], sharded: bool) -> torch.Tensor:
    """One ``torch.optim.Muon`` step of a ``Linear`` weight of ``shape`` from a seeded gradient,
    under FSDP2 (the gradient laid out as the weight is) or on one device; the whole weight after."""
    torch.manual_seed(0)
    model = torch.nn.Linear(shape[1], shape[0], bias=False)
    grad = torch.randn(shape)
    if sharded:
        fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
        grad = distribute_tensor(grad, model.weight.device_mesh, model.weight.placements)
    opt = torch.optim.Muon(model.parameters())
    model.weight.grad = grad
    opt.step()
    return model.weight.full_tensor() if sharded else model.weight.detach()


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    found = 0
    sharded = step((4, 4), sharded=True)
    alone = step((4, 4), sharded=False)
    if not torch.equal(sharded, alone):
        found += 1
        if rank == 0:
            differ = int((sharded != alone).sum())
            print(
                f"[4, 4]: FSDP2 != one device in {differ} of 16 elements, max|diff| {(sharded - alone).abs().max():.3g}"
            )
    try:
        step((1, 7), sharded=True)
    except RuntimeError as e:
        found += 1
        print(f"rank {rank}: [1, 7]: {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
