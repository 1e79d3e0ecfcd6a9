"""``torch.optim.Muon`` through the gates: ``--impl examples.torch_muon:torch_muon``.

torch.optim.Muon takes plain 2-D tensors on one device. This adapter bridges it to sharded
parameters the way users do: every rank keeps a full copy of each parameter, gathers each
gradient whole (DTensor's ``full_tensor``), steps ``torch.optim.Muon`` (and
``torch.optim.AdamW`` for the other parameters) on the copies, and keeps its own piece of the
result (``distribute_tensor``, no communication). Every rank does all the work, so the
gates judge torch's arithmetic at any world size and layout, and the gather and scatter are
this adapter's (DTensor's own calls).

It declares what it is: torch's conventions; every layout but expert parallelism; no 3-D
parameters; no checkpoint through DCP (the inner optimizers hold the copies, not the
model's parameters); and no bf16 parameters (torch keeps bf16 momentum and rounds twice,
where the reference keeps float32 state: a known, documented difference, not a bug).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor, distribute_tensor


def _whole(t: Tensor) -> Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


class TorchMuon(torch.optim.Optimizer):
    """Steps torch.optim.Muon / AdamW on full copies of the parameters."""

    def __init__(self, param_groups: list[dict[str, Any]], **settings: Any) -> None:
        super().__init__([{"params": g["params"], "use_muon": g["use_muon"]} for g in param_groups], {})
        self._pairs: list[tuple[Tensor, Tensor]] = []
        inner = []
        for group in self.param_groups:
            copies = []
            for p in group["params"]:
                full = _whole(p.detach()).clone()
                self._pairs.append((p, full))
                copies.append(full)
            if group["use_muon"]:
                inner.append(
                    torch.optim.Muon(
                        copies,
                        lr=settings["lr"],
                        weight_decay=settings["weight_decay"],
                        momentum=settings["momentum"],
                        nesterov=settings["nesterov"],
                        ns_steps=settings["ns_steps"],
                        adjust_lr_fn=settings["adjust_lr_fn"],
                    )
                )
            else:
                inner.append(
                    torch.optim.AdamW(
                        copies,
                        lr=settings.get("adamw_lr", 3e-4),
                        betas=settings.get("adamw_betas", (0.9, 0.95)),
                        eps=settings.get("adamw_eps", 1e-8),
                        weight_decay=settings.get("adamw_weight_decay", 0.0),
                        foreach=False,
                    )
                )
        self._inner = inner

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        for p, full in self._pairs:
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


def torch_muon(param_groups: list[dict[str, Any]], **settings: Any) -> torch.optim.Optimizer:
    return TorchMuon(param_groups, **settings)


torch_muon.muongate_conventions = {  # type: ignore[attr-defined]
    "momentum_form": "ema",
    "eps_form": "clamp",
    "eps": 1e-7,
    "ns_coefficients": "keller",
    "ns_dtype": "bfloat16",
    "adjust_lr_fn": "original",
}
torch_muon.muongate_features = {"adamw"}  # type: ignore[attr-defined]
torch_muon.muongate_layouts = {"hsdp", "tp", "fsdp_tp", "hsdp_tp"}  # type: ignore[attr-defined]
torch_muon.muongate_package = "torch"  # type: ignore[attr-defined]
