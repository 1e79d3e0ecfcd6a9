"""``torch.optim.Muon`` (single device) through the gates: ``--impl examples.torch_muon:torch_muon``.

torch.optim.Muon takes plain 2-D tensors on one device, so this adapter runs it (and
``torch.optim.AdamW`` for the other parameters) on the local tensors of 1-rank DTensors,
and declares what it is: torch's conventions, world size 1, no 3-D parameters, no
checkpoint through DCP (its inner optimizers hold the local tensors, not the model's
parameters), and no bf16 parameters (torch keeps bf16 momentum and rounds twice, where
the reference keeps float32 state: a known, documented difference, not a bug).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor


class TorchMuon(torch.optim.Optimizer):
    """Steps torch.optim.Muon / AdamW over the parameters' local tensors."""

    def __init__(self, param_groups: list[dict[str, Any]], **settings: Any) -> None:
        super().__init__([{"params": g["params"], "use_muon": g["use_muon"]} for g in param_groups], {})
        self._pairs: list[tuple[Any, torch.Tensor]] = []
        inner = []
        for group in self.param_groups:
            local = []
            for p in group["params"]:
                t = (p.to_local() if isinstance(p, DTensor) else p).detach()
                self._pairs.append((p, t))
                local.append(t)
            if group["use_muon"]:
                inner.append(
                    torch.optim.Muon(
                        local,
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
                        local,
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
        for p, t in self._pairs:
            g = p.grad
            t.grad = None if g is None else (g.to_local() if isinstance(g, DTensor) else g)
        for opt in self._inner:
            opt.step()
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
torch_muon.muongate_max_world = 1  # type: ignore[attr-defined]
torch_muon.muongate_features = {"adamw"}  # type: ignore[attr-defined]
torch_muon.muongate_package = "torch"  # type: ignore[attr-defined]
