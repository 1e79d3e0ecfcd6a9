"""Two things torchtitan 0.3.0's ``DistMuon`` states in its docstring, seen on one H200
(torch 2.11, NCCL, one rank).

Run: ``torchrun --standalone --nproc-per-node 1 examples/findings/torchtitan_dist_muon_contract.py``
(only torch and ``torchtitan==0.3.0`` installed with ``--no-deps``; prints what it sees, exits 0).

1. "Every configured parameter must have a layout-compatible DTensor gradient before each
   rank enters step()": a step with one matrix's gradient missing raises
   ``RuntimeError: DistMuon requires every configured gradient before step()`` naming it,
   where single-device Muon skips that matrix. muongate's ``several_steps`` gate draws
   matrices without a gradient on some steps, so its cell shows this error.
2. "bitwise equality across the two kernel schedules is not part of the contract": a
   batch-first ``[2, 6, 6]`` expert stack (``Shard(0)`` compute) is orthogonalized in one
   batched ``baddbmm`` per iteration; against the same matrices one at a time (``addmm``,
   torch.optim.Muon's arithmetic, written here in torch alone) its step differs in the last
   bits, while a 2-D matrix's (``Owned``) is bitwise.

Both are the package's contract, not bugs.
"""

import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard, distribute_tensor

A, B, C = 3.4445, -4.7750, 2.0315


def flex_shard() -> types.ModuleType:
    spec = importlib.util.find_spec("torchtitan")
    assert spec is not None and spec.submodule_search_locations, "pip install --no-deps torchtitan==0.3.0"
    root = Path(next(iter(spec.submodule_search_locations)))
    for name, path in (("torchtitan", root), ("torchtitan.distributed", root / "distributed")):
        sys.modules.setdefault(name, types.ModuleType(name)).__path__ = [str(path)]
    return importlib.import_module("torchtitan.distributed.flex_shard")


def one_by_one(u: torch.Tensor) -> torch.Tensor:
    """torch.optim.Muon's Newton–Schulz on one matrix (eps clamped)."""
    x = u.bfloat16()
    x = x / x.norm().clamp(min=1e-7)
    for _ in range(5):
        a = x @ x.mT
        x = torch.addmm(x, torch.addmm(a, a, a, beta=B, alpha=C), x, beta=A)
    return x


def main() -> None:
    dist.init_process_group("nccl")
    torch.cuda.set_device(0)
    flex = flex_shard()
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.randn(4, 4, device="cuda"))
    model.idle = torch.nn.Parameter(torch.randn(4, 4, device="cuda"))
    model.stack = torch.nn.Parameter(torch.randn(2, 6, 6, device="cuda"))
    fully_shard(model, mesh=init_device_mesh("cuda", (1,), mesh_dim_names=("dp_shard",)))
    names = ["w", "idle", "stack"]
    params = [model.get_parameter(n) for n in names]
    layout = {n: flex.ComputeLayout(shardings_by_mesh_axis={"dp_shard": flex.Owned() if p.ndim == 2 else Shard(0)})
              for n, p in zip(names, params, strict=True)}  # fmt: skip
    opt = flex.build_dist_muon([{"params": params, "param_names": names}], compute_sharding_by_fqn=layout,
                               bucket_configs=[flex.BucketConfig(patterns=("*",), name="all")],
                               lr=0.02, weight_decay=0.0, momentum=0.95, nesterov=True)  # fmt: skip
    grads = {n: torch.randn(p.shape, device="cuda") for n, p in zip(names, params, strict=True)}
    for n, p in zip(names, params, strict=True):
        p.grad = None if n == "idle" else distribute_tensor(grads[n], p.device_mesh, p.placements)
    try:
        opt.step()
    except RuntimeError as e:
        print(f"1. a step with 'idle' lacking its gradient: {e}", flush=True)
    before = {n: p.full_tensor().clone() for n, p in zip(names, params, strict=True)}
    model.idle.grad = distribute_tensor(grads["idle"], model.idle.device_mesh, model.idle.placements)
    opt.step()
    for n in ("w", "stack"):
        g = grads[n]
        u = torch.lerp(g, g * 0.05, 0.95)  # EMA from zero, Nesterov
        ortho = torch.stack([one_by_one(m) for m in u.reshape(-1, *u.shape[-2:])]).reshape(u.shape)
        scale = max(1.0, g.shape[-2] / g.shape[-1]) ** 0.5
        expected = before[n].add(ortho, alpha=-0.02 * scale)
        diff = (model.get_parameter(n).full_tensor() - expected).abs().max().item()
        print(f"2. {n} {list(g.shape)}: max|diff| against one matrix at a time {diff:.3g}", flush=True)
    dist.barrier()  # every rank has printed before any leaves: torchrun stops the rest once one exits non-zero
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Leave without the interpreter's teardown: gloo's threads outlive destroy_process_group after
    # DTensor and can abort the job there (findings/torch_gloo_threads_outlive_destroy.py).
    sys.stdout.flush()
    os._exit(0)
