"""torchtitan 0.3.0's ``DistMuon`` (``torchtitan.distributed.flex_shard``; ``pip install
--no-deps torchtitan==0.3.0``) through the gates: ``--impl examples.torchtitan_adapter:dist_muon``.
The example of bring-your-own sharding (``Candidate.shard``).

torchtitan lays a model out itself and names its mesh axes (``dp_shard`` for FSDP), and
``DistMuon`` is configured by those names: a ``ComputeLayout`` per parameter FQN says how
its update is computed from its storage (``Owned()`` on ``dp_shard``: one rank gathers the
whole matrix, orthogonalizes it and scatters it back; ``Shard(0)`` for a batch-first 3-D
stack: each rank orthogonalizes its own experts), and ``BucketConfig`` patterns group the
redistributions. So the adapter shards the model its own way, as torchtitan does:
``fully_shard`` on a mesh of the harness's ranks whose one axis is named ``dp_shard``. The
parameters are FSDP2 DTensors, which the harness reads through their placements.

Declared as its source has them: torch.optim.Muon's conventions (EMA momentum, ``eps``
clamped, Keller's coefficients in bf16, the ``original`` lr scale, its default: it also
takes ``match_rms_adamw``, but nothing means the reference's ``none``, so the adapter fixes
one); exactly one parameter
group (no AdamW: torchtitan steps those with another optimizer); momentum kept in the
gradient's dtype (so no ``bf16`` of muongate's float32 kind); 3-D expert stacks, which it
orthogonalizes in one batched product per stack, the stack's norms in one reduction (its
source says batched kernels need not be bitwise one-by-one Muon): the reference's
``ns_stacks="batched"``, bit for bit its Newton–Schulz (``tests/test_reference.py``); and
since each rank batches the experts it holds, the stack in each rank's chunk
(``"per_rank"``: ``ns_stacks`` the case's world size); FSDP2's own parameters
(``fully_shard``); checkpoints (its ``load_state_dict`` post-hook re-plans its redistributions after a load). It refuses a step while any
configured gradient is missing, as its docstring states (``needs_every_grad``). It needs one CUDA
device per process (``_validate_parameter_storage``), so it declares ``cuda`` only: on CPU
every gate skips, naming that.

torchtitan's package ``__init__`` files import its trainer's dependencies (``spmd_types``,
``tyro``, ``datasets`` …), which the optimizer never uses, so ``_flex_shard`` loads the
``flex_shard`` package alone, standing its two parents in with bare namespace modules.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard

from harness.candidates import Candidate


def _flex_shard() -> types.ModuleType:
    if "torchtitan.distributed.flex_shard" not in sys.modules:
        spec = importlib.util.find_spec("torchtitan")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("torchtitan is not installed: pip install --no-deps torchtitan==0.3.0")
        root = Path(next(iter(spec.submodule_search_locations)))
        for name, path in (("torchtitan", root), ("torchtitan.distributed", root / "distributed")):
            module = sys.modules.setdefault(name, types.ModuleType(name))
            module.__path__ = [str(path)]
    return importlib.import_module("torchtitan.distributed.flex_shard")


AXIS = "dp_shard"


def shard_as_torchtitan(module: nn.Module, mesh: DeviceMesh) -> None:
    """``fully_shard`` on a mesh over the harness's ranks with torchtitan's axis name."""
    fully_shard(module, mesh=DeviceMesh.from_group(mesh.get_group(), mesh.device_type, mesh_dim_names=(AXIS,)))


def dist_muon(param_groups: list[dict[str, Any]], **settings: Any) -> Any:
    flex = _flex_shard()
    adamw = [name for g in param_groups if not g.get("use_muon", True) for name in g["param_names"]]
    if adamw:  # sent only by --probe-undeclared: adamw is not declared
        raise ValueError(f"torchtitan's DistMuon steps Muon matrices only; torchtitan steps {adamw} with AdamW")
    (group,) = param_groups
    layouts = {
        name: flex.ComputeLayout(shardings_by_mesh_axis={AXIS: flex.Owned() if p.ndim == 2 else Shard(0)})
        for name, p in zip(group["param_names"], group["params"], strict=True)
    }
    return flex.build_dist_muon(
        [{"params": group["params"], "param_names": group["param_names"]}],
        compute_sharding_by_fqn=layouts,
        bucket_configs=[flex.BucketConfig(patterns=("*",), name="all")],
        lr=settings["lr"],
        weight_decay=settings["weight_decay"],
        momentum=settings["momentum"],
        nesterov=settings["nesterov"],
        ns_steps=settings["ns_steps"],
        eps=settings["eps"],
        adjust_lr_fn=settings["adjust_lr_fn"],
    )


Candidate(
    shard=shard_as_torchtitan,
    conventions={
        "momentum_form": "ema",
        "eps_form": "clamp",
        "ns_coefficients": "keller",
        "ns_dtype": "bfloat16",
        "adjust_lr_fn": "original",
        "ns_stacks": "per_rank",
    },
    features={"experts", "fully_shard", "checkpoint"},
    needs_every_grad=True,
    devices={"cuda"},
    package="torchtitan",
)(dist_muon)
