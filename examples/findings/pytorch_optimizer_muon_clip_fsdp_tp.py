"""``pytorch-optimizer`` 4.1.0's ``MuonClip`` cannot QK-clip a projection laid out by FSDP2 over
tensor parallelism (torch 2.13, gloo).

Run: ``torchrun --standalone --nproc-per-node 4 examples/findings/pytorch_optimizer_muon_clip_fsdp_tp.py``
(only torch and ``pytorch-optimizer==4.1.0``; exits 1 while the finding holds, 0 once it is gone).

Its QK-clip builds each projection's row factors whole, makes them a replicated DTensor and
``redistribute``s them to the weight's placements, keeping every placement that shards dim 0.
FSDP2 over a column-wise tensor-parallel weight places it ``(_StridedShard(dim=0, sf=2),
Shard(0))`` on a ``(dp, tp)`` mesh: the factors' local piece then has another number of rows than
the weight's, and the in-place multiply raises (or, where the sizes happen to broadcast, scales
rows by another head's factor). Here: a 2-head ``q_proj``/``k_proj`` pair of ``nn.Linear(8, 8)``,
``ColwiseParallel`` on ``tp`` then ``fully_shard`` on ``dp``, one head over the threshold; the
same pair under ``fully_shard`` alone, on a 1-D mesh of the 4 ranks, is clipped as on one device.
"""

import os
import sys

import torch
import torch.distributed as dist
from pytorch_optimizer import MuonClip
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(8, 8, bias=False)
        self.k_proj = nn.Linear(8, 8, bias=False)


def clip(tensor_parallel: bool) -> tuple[bool, str]:
    """Whether the clip matched one device's, and what became of it."""
    torch.manual_seed(0)
    model = Attention()
    whole = {name: p.detach().clone() for name, p in model.named_parameters()}
    if tensor_parallel:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], {"q_proj": ColwiseParallel(), "k_proj": ColwiseParallel()})
        fully_shard(model, mesh=mesh["dp"])
    else:
        fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    placements = model.q_proj.weight.placements
    groups = [
        {"params": [model.q_proj.weight], "use_muon": True, "qk_clip": "query", "attention_name": "attn"},
        {"params": [model.k_proj.weight], "use_muon": True, "qk_clip": "key", "attention_name": "attn"},
    ]
    maxima = torch.tensor([4.0, 0.5])  # head 0 over the threshold 1.0: its rows scaled by (1/4)^0.5
    try:
        MuonClip(groups, qk_clip_threshold=1.0).step(attention_max_logits={"attn": maxima})
    except RuntimeError as e:
        return False, f"{placements}: raised {str(e).splitlines()[0][:120]}"
    factor = torch.tensor([0.5] * 4 + [1.0] * 4).unsqueeze(-1)
    q, k = model.q_proj.weight.full_tensor(), model.k_proj.weight.full_tensor()
    off = max(
        (q - whole["q_proj.weight"] * factor).abs().max().item(),
        (k - whole["k_proj.weight"] * factor).abs().max().item(),
    )
    return off == 0, f"{placements}: clipped, max|diff| from one device {off:.3g}"


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results = [clip(tensor_parallel) for tensor_parallel in (False, True)]
    for _, said in results:
        print(f"rank {rank}: {said}", flush=True)
    dist.barrier()  # every rank has printed before any leaves: torchrun stops the rest once one exits non-zero
    dist.destroy_process_group()
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    # Leave without the interpreter's teardown: gloo's threads outlive destroy_process_group after
    # DTensor and can abort the job there (findings/torch_gloo_threads_outlive_destroy.py).
    code = main()
    sys.stdout.flush()
    os._exit(code)
