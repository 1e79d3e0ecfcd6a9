"""``muon-fsdp2`` 0.3.0 (``pip install --no-deps muon-fsdp2==0.3.0``) through the gates:
``--impl examples.muon_fsdp2_adapter:muon_fsdp2``.

Its ``Muon`` takes FSDP2's DTensor parameters on a 1-D mesh as they come: one owner rank per
matrix (the matrix's index in its group, modulo the world size) gathers the shards with
``torch.distributed.gather``, runs a compiled Keller quintic in bf16, and scatters the rows
back. The adapter only translates settings; it declares the package's conventions as its
source has them: EMA momentum (``lerp``), ``eps`` 1e-7 added to the norm, Keller's
coefficients, bf16 Newton–Schulz, and its default ``rms_scale=True``, which is
``match_rms_adamw``. Its quintic is written ``b·A + c·A·A`` and the lr scale multiplies the
update before the lr does, so its arithmetic is not the reference's: judge it with
``--against self`` (itself on a one-rank mesh; its own single-device path does not run,
``examples/findings/muon_fsdp2_single_device.py``). It has no 2-D mesh (its TP + FSDP work
raises ``NotImplementedError``), so it declares no layouts, nor ``checkpoint``. It takes a bf16
parameter and keeps its momentum in it (``torch.zeros_like``), declared as ``bf16`` with the
``bf16_momentum`` difference; and a 3-D parameter as a stack of matrices, each
orthogonalized in one batched call (``zeropower_via_newtonschulz5`` asserts ``ndim >= 2``;
``examples/findings/muons_on_a_3d_parameter.py muon_fsdp2``), declared as ``experts``. The
matrix's probe of 2026-12-05 showed both: its bf16 momentum 0.0018 of its change from the
reference's float32 one, flagged beyond the causes it then declared.
"""

from __future__ import annotations

from typing import Any

from muon_fsdp2 import Muon

from harness.candidates import Candidate


def muon_fsdp2(param_groups: list[dict[str, Any]], **settings: Any) -> Muon:
    groups = []
    for g in param_groups:
        if g["use_muon"]:
            groups.append(
                {
                    "params": g["params"],
                    "use_muon": True,
                    "lr": settings["lr"],
                    "momentum": settings["momentum"],
                    "weight_decay": settings["weight_decay"],
                    "nesterov": settings["nesterov"],
                    "ns_steps": settings["ns_steps"],
                    "rms_scale": True,
                }
            )
        else:
            groups.append(
                {
                    "params": g["params"],
                    "use_muon": False,
                    "lr": settings["adamw_lr"],
                    "betas": settings["adamw_betas"],
                    "eps": settings["adamw_eps"],
                    "weight_decay": settings["adamw_weight_decay"],
                }
            )
    return Muon(groups)


Candidate(
    conventions={
        "momentum_form": "ema",
        "eps_form": "add",
        "eps": 1e-7,
        "ns_coefficients": "keller",
        "ns_dtype": "bfloat16",
        "adjust_lr_fn": "match_rms_adamw",
    },
    features={"adamw", "bf16", "experts"},
    package="muon-fsdp2",
    differences={"plain_quintic", "scaled_update", "bf16_momentum"},
)(muon_fsdp2)
