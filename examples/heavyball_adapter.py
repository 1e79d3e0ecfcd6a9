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

The reference expresses none of these, so every gate skips, naming them: a row of the matrix
that says why, rather than a comparison with another algorithm.
"""

from __future__ import annotations

from typing import Any

import heavyball

from examples.full_copies import LAYOUTS, FullCopies
from harness.candidates import Candidate


def heavyball_muon(param_groups: list[dict[str, Any]], **settings: Any) -> FullCopies:
    def build(groups: list[dict[str, Any]]) -> heavyball.Muon:
        (group,) = [g for g in groups if g["use_muon"]]
        return heavyball.Muon(
            group["params"], lr=settings["lr"], betas=(settings["momentum"], 0.99),
            weight_decay=settings["weight_decay"], nesterov=settings["nesterov"], compile_step=False,
        )  # fmt: skip

    return FullCopies(param_groups, build)


Candidate(
    conventions={
        "ns_input_rounding": "stochastic_bf16",
        "ns_schedule": "modded_nanogpt_quintic_5",
        "nesterov_form": "grad_plus_ema",
    },
    features=set(),
    layouts=LAYOUTS,
    package="heavyball",
)(heavyball_muon)
