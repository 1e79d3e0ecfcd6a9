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

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import reference
from gates.examples.gram_partial_muon import gram_partial_local_gram_muon, gram_partial_muon
from gates.negative_controls import LAYOUT_CONTROLS
from harness.algorithms import MUON
from harness.cases import Case, ParamSpec, layout_cases, settings_of
from harness.layouts import EXPERTS, FSDP, TP
from harness.runner.ran import differed
from harness.session import drawn, gate_config

pytestmark = pytest.mark.gate


@given(case=drawn(lambda s: layout_cases(max_world=s.nproc, min_world=min(2, s.nproc), algorithm=s.algorithm)))
def test_tensor_parallel_and_fsdp_tp_layouts_match_reference_bitwise(gate_runner: Any, case: Case) -> None:
    gate_runner.require("layouts", {"tp"}, "its claim is about tensor-parallel layouts")
    gate_runner.check("layouts", case)


@pytest.mark.judges("muongate's layout gate, with planted layout bugs (negative controls)", "muongate: gates")
@pytest.mark.parametrize("control", sorted(LAYOUT_CONTROLS))
def test_layout_gate_catches_negative_control(gate_runner: Any, control: str) -> None:
    planted, ranks = LAYOUT_CONTROLS[control]
    if ranks > gate_config().nproc:
        pytest.skip(f"{control} shows on {ranks} ranks: needs --nproc {ranks}")

    def on(case: Case) -> Case:
        return replace(case, candidate=planted, mode=None)

    minimal = gate_runner.catch(
        f"negative:layouts:{control}",
        layout_cases(max_world=gate_config().nproc, min_world=ranks, algorithm=MUON),
        lambda case: differed(gate_runner.run(on(case))),
        lambda case: on(case).describe(),
    )
    assert minimal.layout not in (FSDP, EXPERTS), f"{control} was caught on FSDP2 alone: {on(minimal).describe()}"


@st.composite
def _rowwise_cases(draw: st.DrawFn, candidate: Any) -> Case:
    """Row-wise TP float32 weights that are not tall (the Gram-partial path), one step at lr 1
    with no weight decay (the update is then ``-scale·O``, the orthogonalization itself, and
    float32 weights keep it whole), five Newton–Schulz iterations of Keller's coefficients
    (the tier's calibration; Polar Express's steeper ones are not calibrated), on the
    example's conventions."""
    world = draw(st.integers(2, max(2, gate_config().nproc)))
    params = []
    for i in range(draw(st.integers(1, 2))):
        rows = draw(st.integers(1, 32))
        params.append(ParamSpec(f"w{i}", (rows, draw(st.integers(rows, 64))), style="rowwise"))
    settings = {**dict(draw(settings_of(MUON))), "lr": 1.0, "weight_decay": 0.0, "ns_steps": 5,
                "ns_coefficients": "keller", "momentum_form": "sum",
                "eps_form": "add", "adjust_lr_fn": "original"}  # fmt: skip
    return Case(
        params=tuple(params), seed=draw(st.integers(0, 2**16)), world_size=world, mesh=(world,), mode=None,
        settings=tuple(settings.items()), candidate=candidate, layout=TP, reference=reference.Muon,
    )  # fmt: skip


@pytest.mark.judges("the Gram-partial example and its calibrated tier", "example: gram_partial")
@given(case=_rowwise_cases(gram_partial_muon))
def test_gram_partial_update_stays_in_its_calibrated_tier(gate_runner: Any, case: Case) -> None:
    """A candidate whose Newton–Schulz takes X Xᵀ from per-rank partial products and an
    all-reduce cannot be bitwise; its update is held to ``GRAM_PARTIAL`` instead, whose
    bounds were measured between correct and wrong variants (``harness/verdicts/compare.py``)."""
    if gate_config().nproc < 2:
        pytest.skip("a row-wise weight needs two ranks")
    gate_runner.check("tier:gram_partial", case, task="update")


@given(case=_rowwise_cases(None))
def test_a_candidate_declaring_the_gram_partial_tier_stays_in_it(gate_runner: Any, case: Case) -> None:
    """The same claim about an ``--impl`` candidate that declares ``tiers =
    {"gram_partial"}`` (and the ``tp`` layout); on the candidate's declared conventions."""
    if gate_runner.impl is None:
        pytest.skip("tier:gram_partial: judges an --impl candidate that declares it; ShardedMuon is bitwise")
    if gate_config().nproc < 2:
        pytest.skip("a row-wise weight needs two ranks")
    gate_runner.require("tier:gram_partial", {"gram_partial", "tp"}, "its claim is the gram_partial tier")
    gate_runner.check("tier:gram_partial", case, task="update")


@pytest.mark.judges("the calibrated gram_partial tier, with the Gram left local (negative control)", "muongate: gates")
def test_gram_partial_tier_rejects_a_gram_left_local(gate_runner: Any) -> None:
    if gate_config().nproc < 2:
        pytest.skip("a row-wise weight needs two ranks")
    gate_runner.catch(
        "negative:tier:gram_partial:LocalGram",
        _rowwise_cases(gram_partial_local_gram_muon),
        lambda case: differed(gate_runner.run(case, task="update")),
        Case.describe,
    )
