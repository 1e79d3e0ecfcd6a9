"""bitsandbytes 0.50.2's ``AdamW8bit`` cannot step FSDP2's DTensor parameters on the CPU (torch
2.13, gloo): its update ops are not DTensor ops.

Run: ``torchrun --standalone --nproc-per-node 2 examples/findings/bitsandbytes_dtensor_parameters.py``
(torch and ``bitsandbytes==0.50.2`` only; exits 1 while the finding holds, 0 once it is gone).

A parameter of 4096 elements or more gets 8-bit states (``state1`` a DTensor, ``absmax1`` and
``qmap1`` plain tensors) and the step raises ``RuntimeError: bitsandbytes.optimizer_update_8bit_
blockwise.default got mixed torch.Tensor and DTensor``; a smaller one gets float32 states and
raises ``NotImplementedError: Operator bitsandbytes.optimizer_update_32bit.default does not have
a sharding strategy registered``. The gates found it as an error on the first case of every
gate under ``--impl examples.bitsandbytes_adapter:adamw_8bit``. A limit of the package, which
says it has not verified itself under sharding: FSDP2 users must step the local tensors
themselves, where its 4096-element threshold would count a shard, not the parameter.
"""

import os
import sys

import bitsandbytes as bnb
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    failed = 0
    for features in (128, 8):  # 128×64 = 8192 elements (8-bit states), 8×64 = 512 (float32 states)
        model = torch.nn.Linear(64, features, bias=False)
        fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
        opt = bnb.optim.AdamW8bit(model.parameters())
        model(torch.randn(4, 64)).sum().backward()
        try:
            opt.step()
            print(f"rank {rank}: [{features}, 64] stepped", flush=True)
        except (RuntimeError, NotImplementedError) as e:
            print(f"rank {rank}: [{features}, 64]: {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)
            failed = 1
    dist.barrier()  # every rank has printed before any leaves: torchrun stops the rest once one exits non-zero
    dist.destroy_process_group()
    return failed


if __name__ == "__main__":
    # Leave without the interpreter's teardown: gloo's threads outlive destroy_process_group after
    # DTensor and can abort the job there (findings/torch_gloo_threads_outlive_destroy.py).
    code = main()
    sys.stdout.flush()
    os._exit(code)
