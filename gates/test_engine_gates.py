"""Claims about sharding engines that own the model and keep the optimizer's state themselves
(``harness.engines``): DeepSpeed's ZeRO through ``--engine examples.deepspeed_adapter:deepspeed_zero``,
else muongate's own flat engine (``gates/examples/flat_engine.py``), reported as muongate's.

- An engine steps every parameter and every state tensor bit for bit as its one-device side
  does (muongate's reference, or the engine's own optimizer on one device where it declares
  ``judged="self"``), at every stage, accumulation and dtype it declares, with matrices that
  straddle its partitions and parameters without gradients, through its own checkpoints.
- Bitwise because the harness feeds gradients that every engine's reductions sum exactly
  (``harness.engines.case``): what remains is the optimizer, the partitioning and the
  accumulation boundary.
- Each planted engine bug (``flat_engine.CONTROLS``) fails the gate and shrinks.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gates.examples import flat_engine
from harness.engines import LoadedEngine
from harness.engines.case import EngineCase, engine_cases
from harness.session import gate_config

pytestmark = [pytest.mark.gate, pytest.mark.engine]

FLAT = "gates.examples.flat_engine:flat_engine"


def _engine() -> LoadedEngine:
    """The session's ``--engine``, else muongate's flat engine."""
    return gate_config().engine or LoadedEngine.load(FLAT)


def _subject() -> str:
    engine = gate_config().engine
    return engine.spec if engine is not None else "muongate: flat engine (gates/examples/flat_engine.py)"


#: ZeRO's stages × the two optimizers × accumulation steps × dtypes: a cell of the matrix's engine table each
CELLS = [
    (stage, optimizer, acc, dtype)
    for stage in range(4)
    for optimizer in ("muon", "adamw")
    for acc in (1, 2, 4)
    for dtype in ("float32", "bfloat16")
]


def _world() -> int:
    """The pool's size, where every sum of the feed is exact (a power of two)."""
    world = gate_config().nproc
    if world & (world - 1):
        pytest.skip(f"the engine gates run on a power-of-two world (their gradient sums are exact); --nproc {world}")
    return world


@pytest.mark.parametrize(
    ("stage", "optimizer", "accumulate", "dtype"), CELLS, ids=[f"stage{s}-{o}-acc{a}-{d}" for s, o, a, d in CELLS]
)
@given(data=st.data())
@settings(max_examples=max(3, settings().max_examples // 20))
def test_engine_steps_like_its_one_device_side_bitwise(
    gate_runner: Any, stage: int, optimizer: str, accumulate: int, dtype: str, data: Any
) -> None:
    engine = _engine()
    declared = engine.declared
    undeclared = [
        what
        for what, known, value in (
            ("stage", declared.stages, stage),
            ("optimizer", declared.optimizers, optimizer),
            ("accumulation", declared.accumulate, accumulate),
            ("dtype", declared.dtypes, dtype),
        )
        if value not in known  # type: ignore[operator]
    ]
    if undeclared:
        pytest.skip(f"engine: not run: {engine.spec} does not declare this {' or '.join(undeclared)}")
    gate_runner.subject = _subject()
    cases = engine_cases(
        engine.spec, declared, _world(), stage=stage, optimizer=optimizer, accumulate=accumulate, dtype=dtype
    )
    gate_runner.check(f"engine:stage {stage} {optimizer} ×{accumulate} {dtype}", data.draw(cases), task="engine")


@pytest.mark.judges("muongate's engine gate, with planted engine bugs (negative controls)", "muongate: gates")
@pytest.mark.parametrize("control", sorted(flat_engine.CONTROLS))
def test_engine_gate_catches_planted_engine_bug(gate_runner: Any, control: str) -> None:
    if gate_config().nproc < 2:
        pytest.skip("the controls need two ranks")
    spec = f"{flat_engine.__name__}:{control}"
    declared = LoadedEngine.load(spec).declared
    minimal = gate_runner.catch(
        f"negative:engine:{control}",
        engine_cases(spec, declared, 2, checkpoint=False),
        lambda case: gate_runner.run(case, task="engine").message,
        EngineCase.describe,
    )
    assert sum(len(s) for s in minimal.shapes) <= 4 and minimal.steps <= 2, minimal.describe()
