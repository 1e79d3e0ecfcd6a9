"""Claims: the sharded Muon computes single-device Muon bit for bit on the layouts of tensor
parallelism and FSDP2 × TP, built the way users build them (``layout_cases``:
``parallelize_module`` with ``ColwiseParallel`` / ``RowwiseParallel``, then ``fully_shard``
on the data-parallel dim, which gives ``_StridedShard``).

Every rank compares its own piece with the reference's result laid out by DTensor itself
(``distribute_tensor`` of the full tensor to the same mesh and placements, then
``to_local``), so a replicated weight is compared on every replica. With two ranks the
layouts are pure TP; FSDP2 × TP needs ``--nproc 4``.

Negative controls (``negative_controls.LAYOUT_CONTROLS``): Newton–Schulz on the local
columns of a row-wise weight, the lr scale from the local piece's shape, and a
``_StridedShard`` weight gathered in one row order and scattered back in another.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given

from gates.negative_controls import LAYOUT_CONTROLS
from harness.cases import Case, layout_cases

pytestmark = pytest.mark.gate

NPROC = int(os.environ.get("MUONGATE_NPROC", "2"))


@given(case=layout_cases(max_world=NPROC, min_world=min(2, NPROC)))
def test_tensor_parallel_and_fsdp_tp_layouts_match_reference_bitwise(gate_runner: Any, case: Case) -> None:
    gate_runner.require("layouts", {"tp"}, "its claim is about tensor-parallel layouts")
    gate_runner.check("layouts", case)


@pytest.mark.judges("muongate's layout gate, with planted layout bugs (negative controls)", "muongate: gates")
@pytest.mark.parametrize("control", sorted(LAYOUT_CONTROLS))
def test_layout_gate_catches_negative_control(gate_runner: Any, control: str) -> None:
    planted, ranks = LAYOUT_CONTROLS[control]
    if ranks > NPROC:
        pytest.skip(f"{control} shows on {ranks} ranks: needs --nproc {ranks}")

    def on(case: Case) -> Case:
        return replace(case, candidate=planted, mode=None)

    minimal = gate_runner.catch(
        f"negative:layouts:{control}",
        layout_cases(max_world=NPROC, min_world=ranks),
        lambda case: gate_runner.run(on(case)).message,
        lambda case: on(case).describe(),
    )
    assert minimal.layout not in ("fsdp", "3-D"), f"{control} was caught on FSDP2 alone: {on(minimal).describe()}"
