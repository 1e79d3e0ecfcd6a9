"""Keller Jordan's ``muon-optimizer`` 0.1.0 pads its Muon matrices to a multiple of the world
size with ``len(params) % world_size`` empty tensors, which is that only when the world size
is 2 (torch 2.13, gloo).

Run: ``torchrun --standalone --nproc-per-node 4 examples/findings/keller_muon_padding.py``
(only torch and ``muon-optimizer==0.1.0``; exits 1 while the finding holds, 0 once it is gone).

``MuonWithAuxAdam.step`` builds ``params_pad = params + [empty] * (len(params) % world)`` and
then gathers ``params_pad[i : i + world]`` for ``i = 0, world, 2·world, …``. The padding
needed is ``-len(params) % world``: with 5 matrices on 4 ranks it pads 1 instead of 3, so the
last gather's list has 2 tensors for a world of 4: ranks 0 and 1 get gloo's "invalid output
tensor list", ranks 2 and 3 an ``IndexError``. Here: five ``[4, 4]`` weights, all of one
shape, so only the count is at fault; the gates found it with a single matrix on 4 ranks
(ranks 2 and 3 index past the padded list). A bug in the package.
"""

import sys

import torch
import torch.distributed as dist
from muon import MuonWithAuxAdam


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 4)) for _ in range(5)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = MuonWithAuxAdam([{"params": params, "use_muon": True}])
    try:
        opt.step()
    except Exception as e:  # the finding is what the collective raises
        print(f"rank {rank}: step failed: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
        return 1
    print(f"rank {rank}: step completed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
