"""A deliberately broken sharded Muon: ``--impl examples.broken_muon:broken_muon`` must fail.

It is ``distributed_impl.ShardedMuon`` with weight decay computed from the *scaled* lr
(lr · √max(1, rows/cols)) instead of the plain lr: a one-line slip that only shows on
tall matrices with weight decay, which is what the gates must find and shrink to. It is
planted through the public API alone: each Muon matrix gets a param group of its own whose
weight decay is multiplied by that matrix's lr scale.
"""

from __future__ import annotations

from typing import Any

from distributed_impl import ShardedMuon
from reference import lr_scale


def broken_muon(param_groups: list[dict[str, Any]], **settings: Any) -> ShardedMuon:
    groups = []
    for group in param_groups:
        if not group["use_muon"]:
            groups.append(group)
            continue
        for name, p in zip(group["param_names"], group["params"], strict=True):
            decay = settings["weight_decay"] * lr_scale(p.shape, settings["adjust_lr_fn"])
            groups.append({"params": [p], "param_names": [name], "use_muon": True, "weight_decay": decay})
    return ShardedMuon(groups, **settings)
