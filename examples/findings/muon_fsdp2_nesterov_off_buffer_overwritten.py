"""muon-fsdp2 0.3.0 overwrites its momentum buffer with the update when Nesterov is off (torch 2.13, gloo).

Run: ``torchrun --standalone --nproc-per-node 1 examples/findings/muon_fsdp2_nesterov_off_buffer_overwritten.py``
(only torch and ``muon-fsdp2==0.3.0``; exits 1 while the behaviour holds, 0 once it is gone).

``apply_momentum`` returns the momentum buffer itself as the update when ``nesterov=False``,
and ``Fsdp1dWork.start`` stores it as the parameter's gradient. ``finish`` then scatters the
orthogonalized matrix into that gradient's local shard, in place: after the step the buffer
holds the orthogonalized update instead of the momentum, and every later step builds its
momentum on it. With Nesterov on, the update is the gradient (``grad.lerp_``), and the buffer
is right. Here: one FSDP2 weight, momentum 0.9, one step; the buffer should be 0.1 × the
gradient. A bug in the package, found by muongate's "beyond its causes" check: the candidate's
declared differences (its quintic's form, its lr scale) explain a few ULPs of the buffer, not this.
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
    opt = Muon([{"params": list(model.parameters()), "use_muon": True, "momentum": 0.9, "nesterov": False}])
    model(torch.randn(2, 4)).square().sum().backward()
    expected = 0.1 * model.weight.grad.full_tensor()  # lerp from a zero buffer, 1 - momentum
    opt.step()
    buffer = opt.state[model.weight]["momentum_buffer"].full_tensor()
    off = (buffer - expected).abs().max().item()
    print(
        f"momentum buffer after one step, Nesterov off: off by {off:.3g} (largest expected entry {expected.abs().max().item():.3g})"
    )
    dist.barrier()  # every rank has printed before any leaves: torchrun stops the rest once one exits non-zero
    dist.destroy_process_group()
    return 1 if off > 1e-6 else 0


if __name__ == "__main__":
    # Leave without the interpreter's teardown: gloo's threads outlive destroy_process_group after
    # DTensor and can abort the job there (findings/torch_gloo_threads_outlive_destroy.py).
    code = main()
    sys.stdout.flush()
    os._exit(code)
