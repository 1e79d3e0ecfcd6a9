"""Claims: QK-clip (MuonClip's rescale of the query and key projections, head by head, after each
step; ``reference.qk_clip``) computes on sharded projections what it computes on whole ones, bit
for bit, on every rank: each head's factor from the largest logit over every replica's batch,
applied to the rows of that head wherever they are (``harness.tasks.qk_clip``). Drawn on FSDP2,
HSDP and every layout family, heads split unevenly by TP and by FSDP2's rows, thresholds that
clip some heads, every head or none (``qk_clip_cases``). A candidate is judged on the QK-clip it
declares (``Candidate.qk_clip``; muongate's ``ShardedMuon`` declares
``distributed_impl.qk_clip.sharded_qk_clip``).

Negative controls (``clip_controls.QK_CLIP_CONTROLS``): the rank-local maximum logit; each
rank's rows taken as the whole projection's heads; an optimizer's master copies left unclipped,
beside an unplanted twin that clips them too.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings

from gates.clip_controls import QK_CLIP_CONTROLS, MasterQKClipMuon
from harness.cases import Case, qk_clip_cases
from harness.runner.ran import differed
from harness.session import drawn, gate_config

pytestmark = pytest.mark.gate


@given(case=drawn(lambda s: qk_clip_cases(max_world=s.nproc)))
def test_qk_clip_after_each_step_matches_reference_bitwise_on_every_layout(gate_runner: Any, case: Case) -> None:
    gate_runner.algorithm_claim("qk_clip", "QK-clip after Muon's step (MuonClip)")
    gate_runner.declares("qk_clip", "qk_clip", "QK-clip")
    gate_runner.reference_only("qk_clip")
    gate_runner.check("qk_clip", case)


@pytest.mark.judges("muongate's QK-clip gate, with planted QK-clip bugs (negative controls)", "muongate: gates")
@given(case=drawn(lambda s: qk_clip_cases(max_world=s.nproc)))
@settings(max_examples=max(5, settings().max_examples // 10))
def test_unplanted_master_copies_clipped_with_their_weights_match_the_reference(gate_runner: Any, case: Case) -> None:
    """The master-copy control is built on a correct optimizer: the unclipped master is its only bug."""
    gate_runner.check("negative:qk_clip-unplanted", replace(case, candidate=MasterQKClipMuon))


@pytest.mark.judges("muongate's QK-clip gate, with planted QK-clip bugs (negative controls)", "muongate: gates")
@pytest.mark.parametrize("control", sorted(QK_CLIP_CONTROLS))
def test_qk_clip_gate_catches_negative_control(gate_runner: Any, control: str) -> None:
    nproc = gate_config().nproc
    if nproc < 2:
        pytest.skip("a replica's own maximum, or a piece's own heads, needs two ranks")

    def on(case: Case) -> Case:
        return replace(case, candidate=QK_CLIP_CONTROLS[control])

    gate_runner.catch(
        f"negative:qk_clip:{control}",
        qk_clip_cases(max_world=nproc),
        lambda case: differed(gate_runner.run(on(case))),
        lambda case: on(case).describe(),
    )
