"""Claims about a layout a user's job captured (``harness.capture``), replayed with
``--layout-from=FILE`` (``harness.replay``): the candidate computes its reference, bit for bit,
on exactly the captured parameters and placements, on a reduced mesh that keeps every rank's
pieces where the job had more ranks than the pool; the report's header says what was kept.

The clipping gate's claim (``gates/test_clip_gates.py``) and the routing audit
(``gates/test_routing_gates.py``) run on the captured layout too: torch's ``clip_grad_norm_`` (or
the candidate's declared ``clip``) on its parameters, and which algorithm stepped each of them,
listed in the report (the captured model's own split: its param groups).

Its negative control (``PastFirstBucketMuon``) is a bug no drawn case shows: it needs more
elements on one rank than any drawn case holds, as the layout of a real model's sizes does
(``examples/captures/llama-fsdp16.json``, a 16-rank FSDP2 job of ``examples/captures/llama_job.py``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gates.clip_controls import known_torch_finding
from gates.negative_controls import PastFirstBucketMuon
from harness.algorithms import MUON
from harness.capture import load_capture
from harness.cases import Case, Clip, replay_cases
from harness.replay import replay
from harness.runner.ran import differed
from harness.session import gate_config

pytestmark = pytest.mark.gate

#: the capture the negative control replays: a real 16-rank FSDP2 job of a small Llama
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "captures" / "llama-fsdp16.json"


@given(data=st.data())
def test_captured_layout_matches_reference_bitwise(gate_runner: Any, data: st.DataObject) -> None:
    config = gate_config()
    if config.replay is None:
        pytest.skip("replay: replays a captured layout: --layout-from=FILE (harness.capture)")
    gate_runner.check("replay", data.draw(replay_cases(config.replay, algorithm=config.algorithm)))


def _replayed() -> Any:
    replayed = gate_config().replay
    if replayed is None:
        pytest.skip("replay: replays a captured layout: --layout-from=FILE (harness.capture)")
    return replayed


def _clipped(data: st.DataObject) -> Case:
    """A replayed case with its gradients clipped (a max norm that clips, or not; the 2- or inf-norm)."""
    config = gate_config()
    case = data.draw(replay_cases(_replayed(), algorithm=config.algorithm))
    clip = Clip(data.draw(st.sampled_from([1.0, 1e-3, 1e4])), data.draw(st.sampled_from([2.0, math.inf])))
    return replace(case, clip=clip)


@pytest.mark.judges("torch.nn.utils.clip_grad_norm_ on the captured layout, then ShardedMuon's step", "torch: clipping")
@given(data=st.data())
@settings(max_examples=max(5, settings().max_examples // 4))
def test_captured_layout_clips_with_torch_like_the_full_gradients(gate_runner: Any, data: st.DataObject) -> None:
    gate_runner.reference_only("replay:clip:torch")
    gate_runner.check("replay:clip:torch", known_torch_finding(_clipped(data)))


@given(data=st.data())
@settings(max_examples=max(5, settings().max_examples // 4))
def test_captured_layout_clips_with_the_candidate_s_clip_like_the_full_gradients(
    gate_runner: Any, data: st.DataObject
) -> None:
    gate_runner.declares("replay:clip", "clip", "clipping")
    gate_runner.reference_only("replay:clip")
    gate_runner.check("replay:clip", _clipped(data))


@given(data=st.data())
@settings(max_examples=max(5, settings().max_examples // 4))
def test_captured_layout_steps_each_parameter_with_its_declared_algorithm(
    gate_runner: Any, data: st.DataObject
) -> None:
    config = gate_config()
    if not config.algorithm.routes:
        pytest.skip("replay:routing: the reference declares no ROUTES")
    gate_runner.route("replay:routing", data.draw(replay_cases(_replayed(), algorithm=config.algorithm)), table=True)


@pytest.mark.judges("the replay gate, with a bug only a captured layout shows (negative control)", "muongate: gates")
def test_replay_gate_catches_a_bug_past_the_first_bucket(gate_runner: Any) -> None:
    replayed = replay(load_capture(EXAMPLE), nproc=gate_config().nproc, algorithm=MUON)
    if not replayed.meshes:
        pytest.skip("the example capture replays on two ranks or more: needs --nproc 2")

    def on(case: Case) -> Case:
        return replace(case, candidate=PastFirstBucketMuon, mode=None)

    gate_runner.catch(
        "negative:replay:PastFirstBucketMuon",
        replay_cases(replayed, algorithm=MUON),
        lambda case: differed(gate_runner.run(on(case))),
        lambda case: on(case).describe(),
    )
