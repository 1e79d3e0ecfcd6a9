"""Claims about a layout a user's job captured (``harness.capture``), replayed with
``--layout-from FILE`` (``harness.replay``): the candidate computes its reference, bit for bit,
on exactly the captured parameters and placements, on a reduced mesh that keeps every rank's
pieces where the job had more ranks than the pool; the report's header says what was kept.

Its negative control (``PastFirstBucketMuon``) is a bug no drawn case shows: it needs more
elements on one rank than any drawn case holds, as the layout of a real model's sizes does
(``examples/captures/llama-fsdp16.json``, a 16-rank FSDP2 job of ``examples/captures/llama_job.py``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gates.negative_controls import PastFirstBucketMuon
from harness.capture import load_capture
from harness.cases import Case, replay_cases
from harness.replay import replay
from harness.session import gate_config

pytestmark = pytest.mark.gate

#: the capture the negative control replays: a real 16-rank FSDP2 job of a small Llama
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "captures" / "llama-fsdp16.json"


@given(data=st.data())
def test_captured_layout_matches_reference_bitwise(gate_runner: Any, data: st.DataObject) -> None:
    config = gate_config()
    if config.replay is None:
        pytest.skip("replay: replays a captured layout: --layout-from FILE (harness.capture)")
    gate_runner.check("replay", data.draw(replay_cases(config.replay, algorithm=config.algorithm)))


@pytest.mark.judges("the replay gate, with a bug only a captured layout shows (negative control)", "muongate: gates")
def test_replay_gate_catches_a_bug_past_the_first_bucket(gate_runner: Any) -> None:
    replayed = replay(load_capture(EXAMPLE), nproc=gate_config().nproc)
    if not replayed.meshes:
        pytest.skip("the example capture replays on two ranks or more: needs --nproc 2")

    def on(case: Case) -> Case:
        return replace(case, candidate=PastFirstBucketMuon, mode=None)

    gate_runner.catch(
        "negative:replay:PastFirstBucketMuon",
        replay_cases(replayed),
        lambda case: gate_runner.run(on(case)).message,
        lambda case: on(case).describe(),
    )
