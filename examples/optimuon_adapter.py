"""``optimuon`` 0.1.1 (``pip install --no-deps optimuon==0.1.1``) through the gates:
``--impl examples.optimuon_adapter:optimuon_muon --reference none --against self``.

``Muon(distributed=True)`` is written for DDP: every rank holds every matrix whole, the
matrices that have a gradient are sorted by size and dealt out to the ranks of the default
group, each rank steps its own, and one ``dist.all_gather`` per ``world`` matrices hands the
results round (``_distributed_step``). The adapter gives it what DDP would, full copies on
every rank (``examples.full_copies``), so the gates judge the package's own split and gather
at any world size and layout. Its README's recommended use is ``CompositeMuon``: Muon for the
matrices (2-D and up), an auxiliary optimizer for the rest; the adapter routes the same way,
with ``torch.optim.AdamW`` as the auxiliary (its defaults).

It runs with the package's own defaults, as a user gets them: Polar Express coefficients with
a 1.02 norm scale, Gram Newton–Schulz in float16 restarted after two iterations, NorMuon's
variance rescaling, cautious weight decay, momentum as ``m·β + (1 − β)·g`` (``mul_``/``add_``,
not ``lerp``), and, on one device, foreach updates with matrices batched by shape. A tensor of
3 dimensions or more is one matrix ``[d0, d1·d2…]`` to it, not a stack of experts. The
reference expresses none of the first five, so against ``reference.Muon`` every gate skips,
naming them; the claim is ``--against self``: the DDP path, sharded, against the same
package's single-device path (``distributed=False``) on plain tensors, with ``--reference
none`` so that no reference settings are drawn.

The single-device counterpart runs with ``foreach=False, batched_ns=False``: the arithmetic the
DDP path itself runs (a loop of per-tensor ops, one matrix at a time). With its defaults the
single-device path gives other bits than the DDP path on one device already: a bf16 matrix's
foreach update and the Newton–Schulz of same-shape matrices batched into one call round
otherwise (``examples/findings/optimuon_paths_differ.py``). That is a convention of the
package, not a sharding bug, and the claim leaves it out.
"""

from __future__ import annotations

from typing import Any

import torch
from optimuon import Muon

from examples.full_copies import LAYOUTS, FullCopies, Together
from harness.candidates import Candidate


def _route(groups: list[dict[str, Any]], **muon: Any) -> list[torch.optim.Optimizer]:
    """``CompositeMuon``'s routing: Muon for matrices (2-D and up) of Muon groups, AdamW for the rest."""
    params = [(p, g.get("use_muon", True)) for g in groups for p in g["params"]]
    matrices = [p for p, use_muon in params if use_muon and p.ndim >= 2]
    rest = [p for p, use_muon in params if not (use_muon and p.ndim >= 2)]
    optimizers: list[torch.optim.Optimizer] = [Muon(matrices, **muon)] if matrices else []
    return optimizers + ([torch.optim.AdamW(rest, foreach=False)] if rest else [])


def optimuon_muon(param_groups: list[dict[str, Any]], **settings: Any) -> FullCopies:
    return FullCopies(param_groups, lambda groups: _route(groups, distributed=True))


def optimuon_single_device(param_groups: list[dict[str, Any]], **settings: Any) -> Together:
    return Together(param_groups, _route(param_groups, distributed=False, foreach=False, batched_ns=False))


Candidate(
    conventions={
        "ns_coefficients": "polar_express",
        "ns_method": "gram_float16_restart_2",
        "normuon": True,
        "cautious_weight_decay": True,
        "momentum_arithmetic": "mul_add",
    },
    features={"experts", "bf16"},
    layouts=LAYOUTS,
    single_device=optimuon_single_device,
    package="optimuon",
    default_group=True,
)(optimuon_muon)
