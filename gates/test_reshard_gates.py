"""Claims: a checkpoint saved on one layout and world size and loaded on another continues
bit for bit like single-device Muon (``harness.tasks.optimizer.run_reshard_case``).

The first steps run on one layout and are saved with DCP (``get_model_state_dict``,
``get_optimizer_state_dict``); a fresh model and optimizer on the other layout load them
and run the rest; the reference runs every step on one device, and both phases are
compared with it after every step. Peers that test resharding check that loading does not
fail; this checks the values.

The negative control keeps its momentum as a plain tensor of the local piece: the
checkpoint then stores it without its layout.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given

from gates.negative_controls import LocalStateMuon
from harness.cases import ReshardCase, reshard_cases
from harness.runner.ran import differed
from harness.session import drawn, gate_config

pytestmark = pytest.mark.gate

CASES = drawn(lambda s: reshard_cases(max_world=max(2, s.nproc), algorithm=s.algorithm))


@given(case=CASES)
def test_checkpoint_resharded_to_another_layout_and_world_size_continues_bitwise(
    gate_runner: Any, case: ReshardCase
) -> None:
    if gate_config().nproc < 2:
        pytest.skip("resharding needs --nproc 2 at least")
    gate_runner.reference_only("reshard")
    gate_runner.require("reshard", {"checkpoint", "world"}, "its claim is a checkpoint loaded on another layout")
    gate_runner.check("reshard", case, task="reshard")


@pytest.mark.judges("muongate's resharding gate, with a planted state bug (negative control)", "muongate: gates")
def test_reshard_gate_catches_momentum_kept_without_its_layout(gate_runner: Any) -> None:
    if gate_config().nproc < 2:
        pytest.skip("resharding needs --nproc 2 at least")

    def on(case: ReshardCase) -> ReshardCase:
        sides = (replace(c, candidate=LocalStateMuon, mode=None) for c in (case.before, case.after))
        return replace(case, before=next(sides), after=next(sides))

    gate_runner.catch(
        "negative:reshard:LocalStateMuon",
        CASES,
        lambda case: differed(gate_runner.run(on(case), task="reshard")),
        lambda case: on(case).describe(),
    )
