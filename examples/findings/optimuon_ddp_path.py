"""``optimuon`` 0.1.1's DDP path (``Muon(distributed=True)``) against its own single-device path.

Run: ``torchrun --standalone --nproc-per-node 2 examples/findings/optimuon_ddp_path.py [dtypes|unfrozen]``
(only torch and the package; exits 1 while the finding holds, 0 once it is gone).

``_distributed_step`` sorts the matrices that have a gradient by size, deals them out to the
ranks of the default group (rank ``r`` steps matrices ``r``, ``r + world`` …), and hands the
results round with ``dist.all_gather(chunk, chunk[rank])`` over each ``world`` consecutive
matrices. Each rank keeps the momentum only of the matrices it stepped.

``dtypes``
    a float32 and a bfloat16 matrix of one shape, as a model with a bf16 layer has: the
    gather's list mixes dtypes, and torch raises ``ValueError: Invalid usage of tensors with
    different dtypes``. (Matrices of different shapes fail the same way on gloo:
    ``ddp_muon_mixed_shapes.py optimuon``.) A bug in the package's DDP path.
``unfrozen``
    three float32 matrices of one shape, the second without a gradient on the first step (a
    layer unfrozen, an expert that got no tokens): on that step the third goes to rank 1, on
    the next to rank 0, which holds no momentum for it. Its update is silently wrong
    (``max|diff|`` about 8e-3 against the single-device path on the same gradients); the first
    two are bit for bit. A bug in the package's DDP path: the owner of a matrix depends on
    which *other* matrices have a gradient.

The single-device side runs ``foreach=False, batched_ns=False``, the arithmetic the DDP path
runs, so that only the distribution differs (``optimuon_paths_differ.py`` shows why).
"""

import os
import sys

import torch
import torch.distributed as dist
from optimuon import Muon


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    which = sys.argv[1] if len(sys.argv) > 1 else "unfrozen"
    torch.manual_seed(0)
    if which == "dtypes":
        init = [torch.randn(4, 4), torch.randn(4, 4).bfloat16()]
        missing: set[tuple[int, int]] = set()
    else:
        init = [torch.randn(4, 4) for _ in range(3)]
        missing = {(0, 1)}  # (step, matrix): the second matrix has no gradient on the first step
    grads = [[torch.randn(4, 4).to(t.dtype) for t in init] for _ in range(2)]

    def run(**kwargs: bool) -> list[torch.Tensor]:
        params = [torch.nn.Parameter(t.clone()) for t in init]
        opt = Muon(params, **kwargs)
        for step in range(2):
            for i, p in enumerate(params):
                p.grad = None if (step, i) in missing else grads[step][i].clone()
            opt.step()
        return [p.detach() for p in params]

    try:
        sharded = run(distributed=True)
    except Exception as e:  # the finding is what the gather raises
        print(f"rank {rank}: DDP step failed: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
        return 1
    single = run(distributed=False, foreach=False, batched_ns=False)
    differs = 0
    for i, (a, b) in enumerate(zip(sharded, single, strict=True)):
        same = torch.equal(a, b)
        differs += not same
        if rank == 0:
            print(
                f"matrix {i}: DDP path {'==' if same else '!='} single-device path, max|diff| {(a - b).abs().max():.3g}"
            )
    dist.barrier()  # every rank has printed before any leaves: torchrun stops the rest once one exits non-zero
    dist.destroy_process_group()
    return 1 if differs else 0


if __name__ == "__main__":
    # Leave without the interpreter's teardown: gloo's threads outlive destroy_process_group after
    # DTensor and can abort the job there (findings/torch_gloo_threads_outlive_destroy.py).
    code = main()
    sys.stdout.flush()
    os._exit(code)
