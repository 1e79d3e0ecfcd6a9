"""``heavyball`` 3.2.1's ``Muon`` (``pip install --no-deps heavyball==3.2.1``) through the gates:
``--impl examples.heavyball_adapter:heavyball_muon``.

It takes plain tensors on one device, so the adapter bridges it with full copies
(``examples.full_copies``). What it computes is another optimizer than single-device Muon,
and the adapter declares it as its source has it (``heavyball/utils.py``,
``heavyball/chainable.py``):

* ``zeropower_via_newtonschulz5`` runs a schedule of five coefficient triples (modded-nanogpt's
  tuned quintic), not one, and only with 5 steps (``assert steps == 5``);
* its input is rounded to bf16 *stochastically* (``stochastic_round_``: fresh random bits from
  torch's generator every step);
* Nesterov is ``grad + EMA`` (``nesterov_ema``, "equivalent to Grokfast"), not a ``lerp``.

The reference expresses none of these, so against it every gate skips, naming them, rather
than compare another algorithm. What the package does under sharding is judged against its own
single-device self: ``--reference none --against self``. The stochastic rounding draws from
torch's global generator, which the sharded and the single-device side leave in different
states, so the two sides would differ by their random bits alone (up to 6.8e-05 on a ``[4, 4]``
step on one rank, 2026-12-04): the adapter steps under a generator seeded with the step's
number, the same on every rank and on both sides, and restores torch's own afterwards.
"""

from __future__ import annotations

from typing import Any

import heavyball
import torch

from examples.full_copies import LAYOUTS, FullCopies
from harness.candidates import Candidate


class _Seeded(heavyball.Muon):  # type: ignore[misc]
    """``heavyball.Muon`` whose step draws its random bits from a generator seeded with the step's number."""

    def step(self, closure: Any = None) -> Any:
        self.seeded_steps = getattr(self, "seeded_steps", 0) + 1
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seeded_steps)
            return super().step(closure)


def heavyball_muon(param_groups: list[dict[str, Any]], **settings: Any) -> FullCopies:
    def build(groups: list[dict[str, Any]]) -> heavyball.Muon:
        # Without a reference (--reference none) nothing is drawn: no group flag, heavyball's defaults.
        (group,) = [g for g in groups if g.get("use_muon", True)]
        drawn = (
            {"lr": settings["lr"], "betas": (settings["momentum"], 0.99), "weight_decay": settings["weight_decay"],
             "nesterov": settings["nesterov"]}
            if "lr" in settings
            else {}
        )  # fmt: skip
        return _Seeded(group["params"], compile_step=False, **drawn)

    return FullCopies(param_groups, build)


Candidate(
    conventions={
        "ns_input_rounding": "stochastic_bf16",
        "ns_schedule": "modded_nanogpt_quintic_5",
        "nesterov_form": "grad_plus_ema",
    },
    features={"bf16", "experts"},  # bitwise its own single-device self on both (the probe, 2026-12-04)
    layouts=LAYOUTS,
    package="heavyball",
)(heavyball_muon)
