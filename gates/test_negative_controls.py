"""Claims: every known-wrong sharded Muon in ``negative_controls.py`` fails the gates, and
hypothesis shrinks the failure to a small case; the same optimizer without a bug passes.

A gate that cannot fail proves nothing. Each control plants one bug; hypothesis's
``find`` searches the same case space the real gates draw from for a case the gate
rejects, and shrinks it. The minimal case goes into the report, so it shows what each
control was caught on.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings

from gates.negative_controls import (
    NEGATIVE_CONTROLS,
    NORMUON_CONTROLS,
    PlantedMuon,
    PlantedNorMuon,
    ShardSumNormMuon,
    TF32Muon,
)
from harness.algorithms import MUON, Algorithm
from harness.cases import Case, cases, layout_cases, norm_tie_cases
from harness.runner.ran import differed
from harness.session import gate_config
from reference import NorMuon

pytestmark = [
    pytest.mark.gate,
    pytest.mark.judges("muongate's own gates, with planted bugs (negative controls)", "muongate: gates"),
]

CONTROL_CASES = cases(max_world=2, max_steps=3, max_params=2, adamw=False, algorithm=MUON)


def _planted(case: Case, control: type[PlantedMuon]) -> Case:
    """``case`` on two ranks of FSDP2, with ``control`` in the candidate's place."""
    return replace(case, candidate=control, mode=None, world_size=2, mesh=(2,))


@given(case=CONTROL_CASES)
@settings(max_examples=max(5, settings().max_examples // 10))
def test_unplanted_control_matches_the_reference(gate_runner: Any, case: Case) -> None:
    """The optimizer the controls are built on is correct: each bug is the only difference."""
    if gate_config().nproc < 2:
        pytest.skip("the controls run on two ranks")
    gate_runner.check("negative:unplanted", _planted(case, PlantedMuon))


@pytest.mark.parametrize("control", sorted(NEGATIVE_CONTROLS))
def test_gates_catch_negative_control(gate_runner: Any, control: str) -> None:
    if gate_config().nproc < 2:
        pytest.skip("every planted bug needs at least two ranks to show")
    planted = NEGATIVE_CONTROLS[control]
    minimal = gate_runner.catch(
        f"negative:{control}",
        CONTROL_CASES,
        lambda case: differed(gate_runner.run(_planted(case, planted))),
        lambda case: _planted(case, planted).describe(),
    )
    size = sum(p.shape[0] for p in minimal.params)
    assert size <= 64, f"{control}: shrinking left a large case {_planted(minimal, planted).describe()}"


def test_norm_ties_catch_the_shard_sum_norm_with_bf16_newton_schulz_only(gate_runner: Any) -> None:
    """The shard-sum norm under a bf16-only declaration: every case has bf16 Newton–Schulz, so
    only the norm-tie inputs can show the last-bit difference (on the ordinary generators
    with ``ns_dtype`` fixed to bf16 it passed 300 of 300 cases: see the README)."""
    if gate_config().nproc < 2:
        pytest.skip("the controls run on two ranks")
    minimal = gate_runner.catch(
        "negative:ShardSumNormMuon (bf16 only)",
        norm_tie_cases(max_world=2),
        lambda case: differed(gate_runner.run(_planted(case, ShardSumNormMuon))),
        lambda case: _planted(case, ShardSumNormMuon).describe(),
    )
    assert dict(minimal.settings)["ns_dtype"] == "bfloat16"


def test_gates_catch_tf32_left_on_where_float32_is_declared(gate_runner: Any) -> None:
    """A GPU-only bug: CUDA's float32 matmuls in TF32 (``TF32Muon``). Caught only where the
    reference is held to float32 matmuls while the candidate's switch stays on."""
    if gate_config().nproc < 2:
        pytest.skip("the controls run on two ranks")
    if gate_config().device != "cuda":
        pytest.skip("TF32 is CUDA's: this planted bug shows with --gate-device cuda")
    minimal = gate_runner.catch(
        "negative:TF32Muon (cuda)",
        CONTROL_CASES,
        lambda case: differed(gate_runner.run(_planted(case, TF32Muon))),
        lambda case: _planted(case, TF32Muon).describe(),
    )
    assert dict(minimal.settings).get("ns_dtype") == "float32", minimal.describe()


#: NorMuon's cases: its settings and conventions, judged against ``reference.NorMuon``
NORMUON = Algorithm.of(NorMuon)


def _normuon_cases(tp: bool) -> Any:
    if tp:
        return layout_cases(max_world=max(2, gate_config().nproc), min_world=2, algorithm=NORMUON)
    return cases(max_world=2, max_steps=3, max_params=2, adamw=False, algorithm=NORMUON)


@given(case=cases(max_world=2, max_steps=3, max_params=2, adamw=False, algorithm=NORMUON))
@settings(max_examples=max(5, settings().max_examples // 10))
def test_unplanted_normuon_control_matches_the_reference(gate_runner: Any, case: Case) -> None:
    """NorMuon's controls are built on a correct NorMuon: each bug is the only difference."""
    if gate_config().nproc < 2:
        pytest.skip("the controls run on two ranks")
    gate_runner.check("negative:normuon-unplanted", _planted(case, PlantedNorMuon))


@pytest.mark.parametrize("control", sorted(NORMUON_CONTROLS))
def test_gates_catch_normuon_negative_control(gate_runner: Any, control: str) -> None:
    """Against ``reference.NorMuon``, on FSDP2 or (tensor-parallel controls) the layouts users
    build: the statistics and norms of a piece, or of padded rows, are caught and shrunk."""
    if gate_config().nproc < 2:
        pytest.skip("every planted bug needs at least two ranks to show")
    planted, tp = NORMUON_CONTROLS[control]

    def on(case: Case) -> Case:
        return replace(case, candidate=planted, mode=None) if tp else _planted(case, planted)

    minimal = gate_runner.catch(
        f"negative:{control}",
        _normuon_cases(tp),
        lambda case: differed(gate_runner.run(on(case))),
        lambda case: on(case).describe(),
    )
    assert sum(p.shape[0] for p in minimal.params) <= 64, f"{control}: shrinking left {on(minimal).describe()}"
