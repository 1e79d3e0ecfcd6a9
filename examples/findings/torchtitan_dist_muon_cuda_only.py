"""torchtitan 0.3.0's ``DistMuon`` cannot be built on CPU (torch 2.13, gloo): it needs one
CUDA device per process.

Run: ``torchrun --standalone --nproc-per-node 1 examples/findings/torchtitan_dist_muon_cuda_only.py``
(only torch and ``torchtitan==0.3.0`` installed with ``--no-deps``; exits 1 while it holds).

``_initialize_dist_muon`` calls ``_validate_parameter_storage``, which raises
``ValueError: DistMuon requires one CUDA device per process`` for parameters on any other
device. So on CPU and gloo none of muongate's gates can run it; the adapter declares
``devices={"cuda"}``. By design, not a bug. torchtitan's package ``__init__``
files import its trainer's dependencies, so ``flex_shard`` is loaded alone, its parents
stood in by bare namespace modules.
"""

import importlib
import importlib.util
import sys
import types
from pathlib import Path

import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def flex_shard() -> types.ModuleType:
    spec = importlib.util.find_spec("torchtitan")
    assert spec is not None and spec.submodule_search_locations, "pip install --no-deps torchtitan==0.3.0"
    root = Path(next(iter(spec.submodule_search_locations)))
    for name, path in (("torchtitan", root), ("torchtitan.distributed", root / "distributed")):
        sys.modules.setdefault(name, types.ModuleType(name)).__path__ = [str(path)]
    return importlib.import_module("torchtitan.distributed.flex_shard")


def main() -> int:
    dist.init_process_group("gloo")
    flex = flex_shard()
    model = nn.Linear(4, 4, bias=False)
    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp_shard",)))
    try:
        flex.build_dist_muon(
            [{"params": [model.weight], "param_names": ["weight"]}],
            compute_sharding_by_fqn={"weight": flex.ComputeLayout(shardings_by_mesh_axis={"dp_shard": flex.Owned()})},
            bucket_configs=[flex.BucketConfig(patterns=("*",), name="all")],
        )
    except ValueError as e:
        print(f"build_dist_muon failed: {e}", flush=True)
        return 1
    print("build_dist_muon built DistMuon on CPU", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
