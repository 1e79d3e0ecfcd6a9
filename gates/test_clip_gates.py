"""Claims: gradient-norm clipping on sharded gradients computes the norm of the full gradients,
each distinct parameter once, and scales every piece as clipping the full gradients on one
device would; the optimizer then steps bit for bit on the clipped gradients
(``harness.tasks.clipping``). Drawn over FSDP2, HSDP, TP (with TP-replicated matrices and
vectors), FSDP×TP, HSDP×TP and expert parallelism, empty pieces, gradients of very different
sizes, tied weights, and the 2-, inf- and 1-norm (``clip_cases``).

The norm is judged against its float64 value in the tier of a summation order
(``harness.verdicts.compare.CLIP_NORM``); the infinity norm, a maximum, and every scaled gradient, bit
for bit. ``torch.nn.utils.clip_grad_norm_`` is judged on its own (no ``--impl``); a candidate
is judged on the ``clip`` it declares (``Candidate.clip``).

Negative controls (``gates.clip_controls``): a replicated gradient counted once per copy; a tied
weight counted twice; expert norms summed over one expert-parallel rank (four ranks).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings

from gates.clip_controls import CLIP_CONTROLS, UnplantedClipMuon, known_torch_finding
from harness.algorithms import MUON
from harness.cases import Case, clip_cases
from harness.runner.ran import differed
from harness.session import drawn, gate_config

pytestmark = pytest.mark.gate


@pytest.mark.judges("torch.nn.utils.clip_grad_norm_ on DTensor gradients, then ShardedMuon's step", "torch: clipping")
@given(case=drawn(lambda s: clip_cases(max_world=s.nproc, algorithm=MUON)))
def test_torch_clip_grad_norm_on_every_layout_matches_the_full_gradients(gate_runner: Any, case: Case) -> None:
    gate_runner.reference_only("clip:torch")
    gate_runner.check("clip:torch", known_torch_finding(case))


@given(case=drawn(lambda s: clip_cases(max_world=s.nproc, algorithm=s.algorithm)))
def test_candidate_clipping_on_every_layout_matches_the_full_gradients(gate_runner: Any, case: Case) -> None:
    gate_runner.declares("clip", "clip", "clipping")
    gate_runner.reference_only("clip")
    gate_runner.check("clip", case)


controls = pytest.mark.judges(
    "muongate's clipping gate, with planted clipping bugs (negative controls)", "muongate: gates"
)


@controls
@given(case=drawn(lambda s: clip_cases(max_world=s.nproc, algorithm=MUON)))
@settings(max_examples=max(5, settings().max_examples // 4))
def test_unplanted_clip_control_lies_within_the_tier(gate_runner: Any, case: Case) -> None:
    """The hand-written clip the controls are built on is correct: each bug is its only difference."""
    gate_runner.check("negative:unplanted clip", replace(case, candidate=UnplantedClipMuon))


@controls
@pytest.mark.parametrize("control", sorted(CLIP_CONTROLS))
def test_clip_gate_catches_negative_control(gate_runner: Any, control: str) -> None:
    planted, fewest, families = CLIP_CONTROLS[control]
    nproc = gate_config().nproc
    if nproc < fewest:
        pytest.skip(f"{control}: its bug shows on {fewest} ranks or more; the pool has {nproc}")

    def on(case: Case) -> Case:
        return replace(case, candidate=planted)

    gate_runner.catch(
        f"negative:clip:{control}",
        clip_cases(max_world=nproc, families=families, algorithm=MUON),
        lambda case: differed(gate_runner.run(on(case))),
        lambda case: on(case).describe(),
    )
