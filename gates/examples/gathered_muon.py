"""A gather–orthogonalize–scatter Muon written the way many are published, with its own
arithmetic: ``--impl gates.examples.gathered_muon:gathered_muon``.

It is correct, but it is not ``reference.Muon`` bit for bit, by design: Newton–Schulz is
the plain-form quintic (``B = b·A + c·A²; X = a·X + B·X``, as in Keller Jordan's first
version) rather than the reference's fused ``addmm`` form, and the lr scale multiplies
the orthogonalized update before the lr does (one rounding more). It declares both causes, so
against ``reference.Muon`` the bitwise gates judge its differences by their calibrated tier and
are green, ``within causes`` (``harness.verdicts.causes.judge_causes``); against itself on one device
(``--against self``) it is bitwise, which is what shows that its sharding is right.

The update goes through float32 and is rounded to the parameter's dtype once. Applied in
bf16 directly (``local.add_(update.bfloat16(), alpha=-lr)``, as ``torch.optim.Muon``
does on one device), ``--against self`` found that its bits depend on the shard's length
on CPU: a bf16 ``[7, 5]`` weight on two ranks differed from itself on one device.

``gathered_muon_local_norm`` normalizes by the norm of this rank's piece, not the whole
matrix's, a bug that users' Muons shipped: red, past its causes' tier, from world 2.
``gathered_muon_local_lr`` plants the sharding bug that candidates like this ship: the lr
scale √max(1, rows/cols) taken from the local shard's shape instead of the matrix's. Only
``--against self`` shows it as its own finding (world 2, a tall matrix). Two more plant bugs
that hide inside the declared difference from a one-step check, and that the cause gate's
three steps and state must catch: ``gathered_muon_momentum_restart`` starts its momentum
from zero every step (right at the first step, wrong from the second), and
``gathered_muon_normalizes_buffer``, with Nesterov off, normalizes its momentum buffer in
place before gathering it (the step's update is right; the state is not). And
``gathered_muon_unscaled_decay`` decays by ``weight_decay`` without the lr: the cause gate,
without weight decay, cannot see it, and every bitwise gate fails by design anyway; a case
with weight decay lies far past what the declared causes explain, a finding of its own
(``harness.verdicts.causes.beyond_causes``).
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor, distribute_tensor

from harness.candidates import Candidate

A, B, C = 3.4445, -4.7750, 2.0315


def plain_quintic(G: Tensor, steps: int, eps: float, norm: Tensor | None = None) -> Tensor:
    """Newton–Schulz in bf16, in the plain form; normalized by ``norm`` where given (a planted bug's)."""
    X = G.bfloat16()
    tall = X.size(0) > X.size(1)
    if tall:
        X = X.mT
    X = X / ((X.norm() if norm is None else norm.bfloat16()) + eps)
    for _ in range(steps):
        M = X @ X.mT
        X = A * X + (B * M + C * (M @ M)) @ X
    return X.mT if tall else X


class GatheredMuon(torch.optim.Optimizer):
    """Muon for FSDP2's DTensor parameters: momentum on the local piece, the full update
    gathered with ``full_tensor``, orthogonalized, and this rank's piece taken back with
    ``distribute_tensor``."""

    local_shape_lr = False
    #: the settings it reads (a subclass that reads more names them here)
    settings_keys: tuple[str, ...] = ("lr", "weight_decay", "momentum", "nesterov", "ns_steps", "eps")

    def __init__(self, param_groups: list[dict[str, Any]], **settings: Any) -> None:
        defaults = {k: settings[k] for k in self.settings_keys}
        super().__init__([{"params": g["params"]} for g in param_groups], defaults)

    def _scale(self, p: DTensor) -> float:
        rows, cols = p.to_local().shape if self.local_shape_lr else p.shape
        return math.sqrt(max(1.0, rows / cols)) if rows else 1.0

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                p = cast(DTensor, p)
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p, dtype=torch.float32)
                buf = state["momentum_buffer"].to_local()
                g = cast(DTensor, p.grad).to_local().float()
                buf.mul_(group["momentum"]).add_(g)
                update = g.add(buf, alpha=group["momentum"]) if group["nesterov"] else buf
                self._apply_update(p, update, group)
        return None

    def _apply_update(self, p: DTensor, update: Tensor, group: dict[str, Any]) -> None:
        """Orthogonalizes this rank's piece of the update and applies it, with weight decay."""
        full = DTensor.from_local(update, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
        self._apply_orthogonalized(p, plain_quintic(full.full_tensor(), group["ns_steps"], group["eps"]), group)

    def _apply_orthogonalized(self, p: DTensor, ortho: Tensor, group: dict[str, Any]) -> None:
        """Takes this rank's piece of the orthogonalized update and applies it, with weight decay."""
        mine = distribute_tensor(ortho, p.device_mesh, p.placements, src_data_rank=None).to_local()
        local = p.to_local()
        weights = local.float()
        weights.mul_(1 - group["lr"] * group["weight_decay"])
        weights.add_(mine.float() * self._scale(p), alpha=-group["lr"])
        local.copy_(weights)


class GatheredMuonLocalLr(GatheredMuon):
    local_shape_lr = True


class GatheredMuonLocalNorm(GatheredMuon):
    """Normalizes the gathered update by this rank's piece's norm, not the whole matrix's: right on
    one rank, and on more the quintic starts from a matrix whose singular values may pass one."""

    def _apply_update(self, p: DTensor, update: Tensor, group: dict[str, Any]) -> None:
        full = DTensor.from_local(update, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
        ortho = plain_quintic(full.full_tensor(), group["ns_steps"], group["eps"], norm=update.bfloat16().norm())
        self._apply_orthogonalized(p, ortho, group)


class GatheredMuonMomentumRestart(GatheredMuon):
    """Its momentum starts from zero every step: right at the first step, wrong from the second."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        for state in self.state.values():
            state["momentum_buffer"].zero_()
        return super().step(closure)


class GatheredMuonNormalizesBuffer(GatheredMuon):
    """With Nesterov off the update is the momentum buffer itself, and it is normalized in place
    (by the whole update's norm) before it is gathered: the orthogonalization normalizes anyway,
    so the step's update is right to rounding, and the buffer carried to the next step is not."""

    def _apply_update(self, p: DTensor, update: Tensor, group: dict[str, Any]) -> None:
        if not group["nesterov"]:
            full = DTensor.from_local(update, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
            update.div_(full.full_tensor().norm() + group["eps"])
        super()._apply_update(p, update, group)


class GatheredMuonUnscaledDecay(GatheredMuon):
    """Decays the weights by ``weight_decay`` alone, not by ``lr · weight_decay`` (decoupled decay
    written without its lr): right without weight decay, where the cause gate looks; far off
    with any."""

    def _apply_update(self, p: DTensor, update: Tensor, group: dict[str, Any]) -> None:
        lr = group["lr"]
        super()._apply_update(p, update, {**group, "weight_decay": group["weight_decay"] / lr if lr else 0.0})


_DECLARED = Candidate(
    conventions={
        "momentum_form": "sum",
        "ns_coefficients": "keller",
        "eps_form": "add",
        "ns_dtype": "bfloat16",
        "adjust_lr_fn": "original",
    },
    features={"bf16"},
    differences={"plain_quintic", "scaled_update"},
)


def gathered_muon(param_groups: list[dict[str, Any]], **settings: Any) -> GatheredMuon:
    return GatheredMuon(param_groups, **settings)


def gathered_muon_local_lr(param_groups: list[dict[str, Any]], **settings: Any) -> GatheredMuonLocalLr:
    return GatheredMuonLocalLr(param_groups, **settings)


def gathered_muon_local_norm(param_groups: list[dict[str, Any]], **settings: Any) -> GatheredMuonLocalNorm:
    return GatheredMuonLocalNorm(param_groups, **settings)


def gathered_muon_momentum_restart(param_groups: list[dict[str, Any]], **settings: Any) -> GatheredMuonMomentumRestart:
    return GatheredMuonMomentumRestart(param_groups, **settings)


def gathered_muon_normalizes_buffer(
    param_groups: list[dict[str, Any]], **settings: Any
) -> GatheredMuonNormalizesBuffer:
    return GatheredMuonNormalizesBuffer(param_groups, **settings)


def gathered_muon_unscaled_decay(param_groups: list[dict[str, Any]], **settings: Any) -> GatheredMuonUnscaledDecay:
    return GatheredMuonUnscaledDecay(param_groups, **settings)


for _factory in (
    gathered_muon,
    gathered_muon_local_lr,
    gathered_muon_local_norm,
    gathered_muon_unscaled_decay,
    gathered_muon_momentum_restart,
    gathered_muon_normalizes_buffer,
):
    _DECLARED(_factory)
