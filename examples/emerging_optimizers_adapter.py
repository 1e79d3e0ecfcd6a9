"""NVIDIA's ``emerging-optimizers`` 0.3.0 (``pip install --no-deps emerging-optimizers==0.3.0
absl-py``; it needs Python ≥ 3.12, and triton to import) through the gates: its ``Muon``
(``--impl examples.emerging_optimizers_adapter:muon``) and its tensor-parallel Newton–Schulz
``newton_schulz_tp`` in both of its modes (``…:muon_tp`` for ``tp_mode="duplicated"``,
``…:muon_tp_distributed`` for ``"distributed"``).

Its ``Muon`` takes plain 2-D tensors on one device, so the adapter bridges it with full copies
(``examples.full_copies``), as a user would, and it is its own single-device self.

``newton_schulz_tp`` is a function for a caller that holds Megatron-style tensor-parallel
pieces: plain tensors, each rank's even block of a weight along ``partition_dim`` (0 for a
column-parallel weight, 1 for a row-parallel one), with ``tensor_model_parallel`` and
``partition_dim`` set on them. It gathers the block (``duplicated``) or runs Newton–Schulz on
the blocks with the norm and each Gram matrix all-reduced (``distributed``). Its caller is the
package's ``OrthogonalizedOptimizer`` with ``orthogonalize`` overridden, as Megatron-Core's
``TensorParallelMuon`` does (the lr scale from the full shape, the pieces' process group
handed in), so the adapter builds that, bring-your-own sharding (``Candidate.shard``):

* every 2-D parameter is split as Megatron splits it, evenly: column-parallel (rows) for the
  first, third … parameter and row-parallel (columns) for the others, whichever of the two
  divides by the ranks when the first does not; a matrix that neither divides stays whole on
  every rank (Megatron's non-parallel parameter, ``partition_dim`` None). Uneven and empty
  blocks are outside its contract: ``all_gather`` needs equal blocks;
* a rank without a gradient for a matrix that another rank of its group has one for steps it
  with zeros (``newton_schulz_tp`` is a collective, and a whole copy is a replica, stepped as
  the others are): Megatron's gradient buffers are never missing on one rank only.

The adapter picks Keller's coefficients (``coefficient_type="simple"``), Nesterov as the case
draws it, no weight decay inside its mixin (the reference's decoupled decay is its default,
``weight_decay_method="decoupled"``), and the ``original`` lr scale
(``scale_mode="shape_scaling"``). Declared as its source has them: EMA momentum, the norm
clamped at 1e-7 (``F.normalize``), the default ``fp32_matmul_prec="medium"``, which runs
Newton–Schulz in bf16 after normalizing in float32 (``fp32_normalize``), and the lr scale
multiplying the float32 update before the lr (``scaled_update``); momentum in the parameter's
dtype; at least one Newton–Schulz iteration (``num_ns_steps=0`` is refused by name). CPU CI
has Python 3.11, so it runs on the GPU machine's Python 3.12.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import torch
from emerging_optimizers.orthogonalized_optimizers import OrthogonalizedOptimizer, get_muon_scale_factor
from emerging_optimizers.orthogonalized_optimizers.muon import Muon
from emerging_optimizers.orthogonalized_optimizers.muon_utils import newton_schulz_tp
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh

from examples.full_copies import LAYOUTS, FullCopies, gradient_somewhere
from harness.candidates import Candidate, declaration_of


def _muon(groups: list[dict[str, Any]], settings: dict[str, Any]) -> Muon:
    (group,) = [g for g in groups if g["use_muon"]]
    return Muon(
        group["params"],
        lr=settings["lr"],
        momentum=settings["momentum"],
        weight_decay=settings["weight_decay"],
        nesterov=settings["nesterov"],
        coefficient_type="simple",
        num_ns_steps=settings["ns_steps"],
        scale_mode="shape_scaling",
    )


def muon(param_groups: list[dict[str, Any]], **settings: Any) -> FullCopies:
    return FullCopies(param_groups, lambda groups: _muon(groups, settings))


def muon_single_device(param_groups: list[dict[str, Any]], **settings: Any) -> Muon:
    return _muon(param_groups, settings)


def _partition_dim(shape: torch.Size, ranks: int, index: int) -> int | None:
    """The dim Megatron would split a weight along: rows for even ``index``, else columns;
    the other one when the first does not divide by ``ranks``; None when neither does."""
    if len(shape) != 2:
        return None
    order = (0, 1) if index % 2 == 0 else (1, 0)
    return next((d for d in order if shape[d] and shape[d] % ranks == 0), None)


def shard_like_megatron(module: nn.Module, mesh: DeviceMesh) -> None:
    """Each splittable weight becomes this rank's even block of it, with Megatron's attributes."""
    group, ranks, rank = mesh.get_group(), mesh.size(), mesh.get_local_rank()
    for index, (path, p) in enumerate(list(module.named_parameters())):
        p.tp_group = group  # type: ignore[attr-defined]
        dim = _partition_dim(p.shape, ranks, index)
        if dim is None:
            continue
        width = p.shape[dim] // ranks
        piece = nn.Parameter(p.detach().narrow(dim, rank * width, width).clone())
        piece.tensor_model_parallel = True  # type: ignore[attr-defined]
        piece.partition_dim = dim  # type: ignore[attr-defined]
        piece.tp_block = (rank * width, (rank + 1) * width)  # type: ignore[attr-defined]
        piece.tp_group = group  # type: ignore[attr-defined]
        owner = module.get_submodule(path.rpartition(".")[0]) if "." in path else module
        owner.register_parameter(path.rpartition(".")[2], piece)


def megatron_piece(name: str, param: Tensor) -> tuple[slice, ...]:
    """Its block's slices, or all of it for a weight that stays whole."""
    dim = getattr(param, "partition_dim", None)
    return tuple(slice(*param.tp_block) if d == dim else slice(None) for d in range(param.ndim))


class TensorParallelMuon(OrthogonalizedOptimizer):
    """The package's Muon over Megatron-style TP pieces: ``orthogonalize`` through
    ``newton_schulz_tp`` with each piece's ``partition_dim`` and group, the lr scale from the
    full shape (``shape_scaling``), as Megatron-Core's ``TensorParallelMuon`` calls it."""

    def __init__(self, params: Any, settings: dict[str, Any], tp_mode: Literal["duplicated", "distributed"]) -> None:
        if settings["ns_steps"] < 1:
            raise ValueError(f"num_ns_steps must be at least 1, got {settings['ns_steps']}")
        self.steps, self.tp_mode = settings["ns_steps"], tp_mode
        super().__init__(
            params, settings["lr"], settings["momentum"], settings["weight_decay"], nesterov=settings["nesterov"],
            weight_decay_method="decoupled", fp32_matmul_prec="medium",
        )  # fmt: skip

    def orthogonalize(self, p: Tensor, grad: Tensor, **kwargs: Any) -> Tensor:
        dim, group = getattr(p, "partition_dim", None), getattr(p, "tp_group", None)
        size = list(grad.shape)
        if dim is not None:
            size[dim] *= torch.distributed.get_world_size(group)
        ortho = newton_schulz_tp(grad, self.steps, "simple", group, partition_dim=dim, tp_mode=self.tp_mode)
        return ortho * get_muon_scale_factor(size[0], size[1], mode="shape_scaling")

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        for group in self.param_groups:
            for p in group["params"]:
                if hasattr(p, "tp_group") and gradient_somewhere(p, [p.tp_group]) and p.grad is None:
                    p.grad = torch.zeros_like(p)
        return super().step(closure)


def _tensor_parallel(
    param_groups: list[dict[str, Any]], settings: dict[str, Any], tp_mode: Literal["duplicated", "distributed"]
) -> TensorParallelMuon:
    (group,) = [g for g in param_groups if g["use_muon"]]
    return TensorParallelMuon(group["params"], settings, tp_mode)


def muon_tp(param_groups: list[dict[str, Any]], **settings: Any) -> TensorParallelMuon:
    return _tensor_parallel(param_groups, settings, "duplicated")


def muon_tp_distributed(param_groups: list[dict[str, Any]], **settings: Any) -> TensorParallelMuon:
    return _tensor_parallel(param_groups, settings, "distributed")


Candidate(
    conventions={
        "momentum_form": "ema",
        "eps_form": "clamp",
        "eps": 1e-7,
        "ns_coefficients": "keller",
        "ns_dtype": "bfloat16",
        "adjust_lr_fn": "original",
    },
    features=set(),
    layouts=LAYOUTS,
    differences={"scaled_update", "fp32_normalize"},
    single_device=muon_single_device,
    min_ns_steps=1,  # it raises "num_ns_steps must be at least 1"
    package="emerging-optimizers",
)(muon)
for _factory in (muon_tp, muon_tp_distributed):
    dataclasses.replace(declaration_of(muon), layouts=(), shard=shard_like_megatron, piece=megatron_piece)(_factory)
