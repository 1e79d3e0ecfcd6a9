"""torchao 0.18's ``AdamW8bit`` cannot step bf16 parameters under FSDP2 on the CPU (torch 2.11 and
2.13, gloo), compiled as torchao runs it or eagerly.

Run: ``torchrun --standalone --nproc-per-node 2 examples/findings/torchao_bf16_fsdp2.py [eager]``
(torch and ``torchao==0.18.0`` only; exits 1 while the finding holds, 0 once it is gone).

A bf16 ``[64, 128]`` weight after ``fully_shard`` on two ranks (4,096 elements a rank, so its
states are quantized). Compiled (torchao's default: ``torch.compile`` of each parameter's step)
the step raises ``InternalTorchDynamoError: NotImplementedError: OptimState8bit dispatch: …
aten.view.dtype``; eagerly (``eager``; the gates run torchao eagerly, being tens of seconds a
case faster on the CPU) ``RuntimeError: expected dtype torch.bfloat16 for `end`, but got dtype
torch.float32`` in the moments' ``lerp``. float32 parameters step. The gates found it as an error
on ``w0[4096] bfloat16 · world 1 · 1 step`` (a one-rank FSDP2 mesh) under ``--impl
examples.torchao_adapter:adamw_8bit``. Seen on the CPU only; torchao's FSDP2 tests run on GPUs. A
limit of the package on the CPU, and perhaps a bug: not tried on a GPU.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torchao.optim import AdamW8bit


def main() -> int:
    dist.init_process_group("gloo")
    if sys.argv[1:] == ["eager"]:
        torch.compile = lambda fn, **_: fn
    model = torch.nn.Linear(128, 64, bias=False).to(torch.bfloat16)
    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    opt = AdamW8bit(model.parameters())
    model(torch.randn(4, 128, dtype=torch.bfloat16)).float().sum().backward()
    failed = 0
    try:
        opt.step()
        print(f"rank {dist.get_rank()}: stepped", flush=True)
    except Exception as e:  # the finding is what the step raises, compiled or eager
        print(f"rank {dist.get_rank()}: {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
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
