"""The bridge for optimizers written for whole tensors (one device, or DDP's replicas):
every rank keeps a full copy of each parameter, gathers each gradient whole (DTensor's
``full_tensor``), steps the wrapped optimizer on the copies, and keeps its own piece of the
result (``distribute_tensor``, no communication). The gather and the scatter are DTensor's
own calls and this bridge's; everything between is the wrapped package's, at any world
size and layout. An optimizer for DDP's replicas (one that splits the matrices between the
ranks of the default group and all-gathers the results) gets the same full copies on every
rank that DDP would give it.

The ranks first agree which parameters have a gradient anywhere (a max over each mesh
dim); a rank without one for such a parameter joins the gather with zeros, as the
reference counts the missing piece. Before they agreed, a rank lacking a gradient the
others had left them waiting in the gather (the robustness gate found it): the bridge's
fault, not the wrapped package's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor, distribute_tensor


def _whole(t: Tensor) -> Tensor:
    """``t`` whole, laid out contiguously, as DDP's replicas are: on torch 2.11, ``full_tensor``
    of a matrix split unevenly by columns is a view of the padded gather (a ``[21, 17]`` bf16
    matrix came back with strides ``(18, 1)``), and a package's bf16 step on such a gradient
    rounds otherwise from the second step (optimuon: 1 to 3 ULP), which is this bridge's doing."""
    return t.full_tensor().contiguous() if isinstance(t, DTensor) else t


def gradient_somewhere(p: Tensor, groups: list[Any]) -> bool:
    """Whether any rank of ``groups`` (taken one after another: a mesh's dims) has a gradient for ``p``."""
    device = p.to_local().device if isinstance(p, DTensor) else p.device
    flag = torch.tensor([float(p.grad is not None)], device=device)
    for group in groups:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return bool(flag.item())


class FullCopies(torch.optim.Optimizer):
    """Steps the optimizers ``build`` makes, on full copies of the parameters.

    ``build`` gets the param groups with the copies in place of the parameters (each group's
    other keys as the harness gave them) and returns an optimizer or a list of them."""

    def __init__(
        self,
        param_groups: list[dict[str, Any]],
        build: Callable[[list[dict[str, Any]]], torch.optim.Optimizer | list[torch.optim.Optimizer]],
    ) -> None:
        # a hybrid reference's groups say which take Muon; under --reference none there is one group
        super().__init__([{"params": g["params"], "use_muon": g.get("use_muon", True)} for g in param_groups], {})
        self._pairs: list[tuple[Tensor, Tensor]] = []
        copied = []
        for group in param_groups:
            copies = []
            for p in group["params"]:
                full = _whole(p.detach()).clone()
                self._pairs.append((p, full))
                copies.append(full)
            copied.append({**group, "params": copies})
        inner = build(copied)
        self._inner = inner if isinstance(inner, list) else [inner]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        for p, full in self._pairs:
            mesh = p.device_mesh if isinstance(p, DTensor) else None
            if mesh is not None and gradient_somewhere(p, [mesh.get_group(d) for d in range(mesh.ndim)]):
                grad = p.grad if p.grad is not None else torch.zeros_like(p)
                full.grad = _whole(grad)
            else:
                full.grad = None if p.grad is None else _whole(p.grad)
        for opt in self._inner:
            opt.step()
        for p, full in self._pairs:
            if isinstance(p, DTensor):
                piece = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
                p.to_local().copy_(piece)
            else:
                p.copy_(full)
        return None


class Together(torch.optim.Optimizer):
    """Several optimizers stepped as one (a Muon and an AdamW for the rest, as packages pair
    them), each on its own parameters as it got them; their state is seen as this one's."""

    def __init__(self, param_groups: list[dict[str, Any]], inner: list[torch.optim.Optimizer]) -> None:
        super().__init__([{"params": g["params"]} for g in param_groups], {})
        self._inner = inner

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        for opt in self._inner:
            opt.step()
            self.state.update(opt.state)
        return None


#: every layout but expert parallelism: the bridge reads any DTensor whole
LAYOUTS = {"hsdp", "tp", "fsdp_tp", "hsdp_tp"}
