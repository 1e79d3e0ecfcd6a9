"""torchao 0.18's low-bit AdamWs decide per *local shard* whether to quantize a state, so the same
parameter is stepped with 8-bit moments on one device and float32 moments under FSDP2 (torch
2.13, gloo, CPU).

Run: ``torchrun --standalone --nproc-per-node 2 examples/findings/torchao_quantizes_per_shard.py``
(torch and ``torchao==0.18.0`` only; exits 1 while the finding holds, 0 once it is gone).

``_LowBitAdam._new_buffer`` (``torchao/optim/adam.py``) quantizes a state only if the local
piece has at least 4096 elements and a multiple of the block size. A ``[4096]`` parameter has
4096 on one device (quantized: ``OptimState8bit``) and 2048 per rank under ``fully_shard`` on two
ranks (left a plain float32 tensor), so after one step the sharded moments are not the one-device
moments: the gates found it as ``one_step`` under ``--against self``, ``w0[4096] · world 2 ·
1 step``, ``exp_avg`` off in 2,046 of 2,048 elements on each rank. Which states are quantized
therefore depends on the world size (and changes when a checkpoint is resharded). The package
does what its code says; whether "per tensor" should mean the full tensor is its call. muongate
reports it as a difference from the optimizer's own one-device result.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torchao.optim import AdamW8bit


def one_step(model: torch.nn.Module) -> torch.Tensor:
    opt = AdamW8bit(model.parameters())
    full = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 1e-3
    w = model.weight
    model.weight.grad = full if not hasattr(w, "device_mesh") else distribute_like(full, w)
    torch.compile = lambda fn, **_: fn  # torchao compiles each step; eagerly the same function, faster on the CPU
    opt.step()
    state = opt.state[model.weight]["exp_avg"]
    local = state.to_local() if hasattr(state, "to_local") else state
    print(f"rank {dist.get_rank()}: exp_avg of the [4096] weight is a {type(local).__name__}", flush=True)
    return local.dequantize() if hasattr(local, "dequantize") and type(local) is not torch.Tensor else local


def distribute_like(full: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(full, p.device_mesh, p.placements)


class Weight(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(-1, 1, 4096))


def main() -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    whole = one_step(Weight())  # on this rank alone, unsharded
    sharded_model = Weight()
    fully_shard(sharded_model, mesh=init_device_mesh("cpu", (world,)))
    mine = one_step(sharded_model)
    expected = whole.chunk(world)[rank]
    same = torch.equal(expected.view(torch.int32), mine.float().view(torch.int32))
    print(f"rank {rank}: sharded exp_avg {'equals' if same else 'differs from'} the one-device exp_avg", flush=True)
    dist.barrier()  # every rank has printed before any leaves: torchrun stops the rest once one exits non-zero
    dist.destroy_process_group()
    return 0 if same else 1


if __name__ == "__main__":
    # Leave without the interpreter's teardown: gloo's threads outlive destroy_process_group after
    # DTensor and can abort the job there (findings/torch_gloo_threads_outlive_destroy.py).
    code = main()
    sys.stdout.flush()
    os._exit(code)
