"""Claims about sharding engines that own the model and keep the optimizer's state themselves
(``harness.engines``), run only under ``--engine``: DeepSpeed's ZeRO with
``--engine examples.deepspeed_adapter:deepspeed_zero``, muongate's own flat engine
(``gates/examples/flat_engine.py``, reported as muongate's) with
``--engine gates.examples.flat_engine:flat_engine``.

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

import os
import pickle
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gates.examples import flat_engine
from harness.engines import EngineConfig, LoadedEngine
from harness.engines.case import (
    EngineCase,
    clip_cases,
    divisor_counts,
    engine_cases,
    exact_counts,
    judged,
    per_head_cases,
)
from harness.runner.ran import differed
from harness.session import gate_config
from reports.records import Comparison

pytestmark = [pytest.mark.gate, pytest.mark.engine]

FLAT = "gates.examples.flat_engine:flat_engine"


def _engine() -> LoadedEngine:
    """The session's ``--engine`` (these gates run only under it; collected without one, they
    are parametrized for muongate's flat engine, then deselected)."""
    return gate_config().engine or LoadedEngine.load(FLAT)


def _subject() -> str:
    """The session's engine, as the header names it, so that a run counts its cases as judging it
    (``reports.summary.unjudged_reason``); muongate's flat engine is a candidate like another here."""
    return _engine().spec


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test per cell the engine declares (a cell of the matrix's engine table each): stage ×
    optimizer × accumulation steps × dtype for the steps, stage × optimizer × the world sizes
    1 and 4 for resharding. Undeclared cells are not collected; the engine's declaration, shown
    beside its rows, says what it leaves out."""
    declared = _engine().declared
    if {"stage", "accumulate", "dtype"} <= set(metafunc.fixturenames):
        cells = [
            (stage, optimizer, acc, dtype)
            for stage in declared.stages
            for optimizer in sorted(declared.optimizers)
            for acc in exact_counts(declared)
            for dtype in sorted(declared.dtypes)
        ]
        ids = [f"stage{s}-{o}-acc{a}-{d}" for s, o, a, d in cells]
        metafunc.parametrize(("stage", "optimizer", "accumulate", "dtype"), cells, ids=ids)
    elif {"clip_stage", "clip_optimizer"} <= set(metafunc.fixturenames):
        pairs = [(s, o) for s in sorted(declared.stages) for o in sorted(declared.optimizers)]
        metafunc.parametrize(("clip_stage", "clip_optimizer"), pairs, ids=[f"stage{s}-{o}" for s, o in pairs])
    elif "head_stage" in metafunc.fixturenames:
        metafunc.parametrize("head_stage", sorted(declared.stages), ids=[f"stage{s}" for s in sorted(declared.stages)])
    elif {"stage", "world"} <= set(metafunc.fixturenames):
        moves = [
            (s, o, w) for s in declared.reshard_stages for o in sorted(declared.reshard_optimizers) for w in (1, 4)
        ]
        metafunc.parametrize(("stage", "optimizer", "world"), moves, ids=[f"stage{s}-{o}-to{w}" for s, o, w in moves])


def _world() -> int:
    """The pool's size, where every sum of the feed is exact (a power of two)."""
    world = gate_config().nproc
    if world & (world - 1):
        pytest.skip(f"the engine gates run on a power-of-two world (their gradient sums are exact); --nproc {world}")
    return world


def _caught(gate_runner: Any, name: str, spec: str, world: int = 2, **drawn: Any) -> EngineCase:
    """The minimal case of the planted engine ``spec`` that the engine gate catches, reported as
    ``name``: its cases drawn by ``engine_cases`` on ``world`` ranks, with ``drawn``, no checkpoint."""
    declared = LoadedEngine.load(spec).declared
    return gate_runner.catch(
        name,
        engine_cases(spec, declared, world, checkpoint=False, **drawn),
        lambda case: differed(gate_runner.run(case, task="engine")),
        EngineCase.describe,
    )


def _blind_on_the_exact_feed(gate_runner: Any, minimal: EngineCase) -> None:
    blind = gate_runner.run(replace(minimal, witness="exact"), task="engine")
    assert not differed(blind), "the exact feed's sums are exact in bf16 too: it cannot see the reduction's dtype"


@given(data=st.data())
@settings(max_examples=max(3, settings().max_examples // 20))
def test_engine_steps_like_its_one_device_side_bitwise(
    gate_runner: Any, stage: int, optimizer: str, accumulate: int, dtype: str, data: Any
) -> None:
    engine = _engine()
    declared = engine.declared
    gate_runner.subject = _subject()
    cases = engine_cases(
        engine.spec, declared, _world(), stage=stage, optimizer=optimizer, accumulate=accumulate, dtype=dtype
    )
    gate_runner.check(f"engine:stage {stage} {optimizer} ×{accumulate} {dtype}", data.draw(cases), task="engine")


@given(data=st.data())
@settings(max_examples=max(3, settings().max_examples // 20))
def test_engine_reduces_and_accumulates_float32_gradients_in_float32(gate_runner: Any, data: Any) -> None:
    """The precision witness (``harness.engines.case``): float32 gradients whose every sum is exact
    in float32 and rounds in bf16, so a reduction or an accumulation carried in bf16 where the
    engine declares float32 differs bitwise, which the exact feed cannot show."""
    engine = _engine()
    if "float32" not in engine.declared.dtypes:  # type: ignore[operator]
        pytest.skip(f"engine:precision: {engine.spec} declares no float32 cases")
    gate_runner.subject = _subject()
    cases = engine_cases(engine.spec, engine.declared, _world(), dtype="float32", checkpoint=False, witness="precision")
    gate_runner.check("engine:precision float32", data.draw(cases), task="engine")


@given(data=st.data())
@settings(max_examples=max(3, settings().max_examples // 20))
def test_engine_divides_by_world_sizes_and_accumulation_counts_that_are_not_powers_of_two(
    gate_runner: Any, data: Any
) -> None:
    """The divisor witness (``harness.engines.case``): float32 gradients that every correct division
    by the world size and the accumulation count keeps exact, at counts whose product is not a power
    of two, so a wrong divisor, group or reduction differs bitwise where powers of two can hide it."""
    engine, world = _engine(), gate_config().nproc  # any world: the witness's divisions are exact on each
    if "float32" not in engine.declared.dtypes:  # type: ignore[operator]
        pytest.skip(f"engine:divisor: {engine.spec} declares no float32 cases")
    if not divisor_counts(engine.declared, world):
        pytest.skip(
            f"engine:divisor: {engine.spec} declares accumulate={list(engine.declared.accumulate)}; on {world} "
            "ranks each makes a power of two: declare accumulate=(…, 3), or run --nproc 3"
        )
    gate_runner.subject = _subject()
    cases = engine_cases(engine.spec, engine.declared, world, dtype="float32", checkpoint=False, witness="divisor")
    gate_runner.check("engine:divisor float32", data.draw(cases), task="engine")


@given(data=st.data())
@settings(max_examples=max(3, settings().max_examples // 20))
def test_engine_steps_a_parameter_that_has_a_gradient_on_some_ranks_only(gate_runner: Any, data: Any) -> None:
    """Rank-asymmetric gradients: one parameter that some ranks' micro-batches never reach (a layer
    their tokens skip, an expert with no tokens there). The mean counts their gradients as zeros,
    and the parameter steps on it wherever any rank had one. Float32, as the witnesses: the claim
    is the reduction's, and the bf16 cells' own findings are the main gate's, cell by cell."""
    engine = _engine()
    if _world() < 2:
        pytest.skip("engine:asymmetric: a gradient on some ranks only needs two ranks")
    gate_runner.subject = _subject()
    cases = engine_cases(engine.spec, engine.declared, _world(), dtype="float32", checkpoint=False, asymmetric=True)
    gate_runner.check("engine:asymmetric", data.draw(cases), task="engine")


@given(data=st.data())
@settings(max_examples=max(3, settings().max_examples // 20))
def test_engine_orthogonalizes_each_head_of_a_query_projection_as_the_reference_does(
    gate_runner: Any, head_stage: int, data: Any
) -> None:
    """Per-head Muon (``Engine.per_head``), float32: the query projection per head, the other
    matrices whole, bit for bit against ``reference.Muon`` with ``ns_heads`` on that matrix."""
    engine = _engine()
    if engine.declared.per_head is None:
        pytest.skip(f"engine:per-head: {engine.spec} declares no per-head Muon setting (Engine.per_head)")
    gate_runner.subject = _subject()
    cases = per_head_cases(engine.spec, replace(engine.declared, dtypes={"float32"}), _world(), stage=head_stage)
    gate_runner.check(f"engine:per-head stage {head_stage}", data.draw(cases), task="engine")


@given(data=st.data())
@settings(max_examples=max(3, settings().max_examples // 20))
def test_engine_clips_by_the_norm_of_the_full_gradients(
    gate_runner: Any, clip_stage: int, clip_optimizer: str, data: Any
) -> None:
    """Gradient clipping (``Engine.clip``), float32: the norm the engine clipped by against the
    float64 norm of the mean gradients (``CLIP_NORM``), then every parameter and state bit for
    bit against the one-device side stepping on the gradients scaled by that norm, in the
    engine's declared form."""
    engine = _engine()
    if engine.declared.clip is None:
        pytest.skip(f"engine:clip: {engine.spec} declares no gradient clipping (Engine.clip)")
    probe = EngineConfig(clip_optimizer, clip_stage, 1, None, "float32", (), 1.0)
    if engine.declared.clip(probe) is None:
        pytest.skip(f"engine:clip: {engine.spec} declares that it reports no clipping norm at stage {clip_stage}")
    gate_runner.subject = _subject()
    cases = clip_cases(engine.spec, engine.declared, _world(), stage=clip_stage, optimizer=clip_optimizer)
    gate_runner.check(f"engine:clip stage {clip_stage} {clip_optimizer}", data.draw(cases), task="engine")


#: a hand-picked case whose matrices straddle the partitions at 1, 2 and 4 ranks
RESHARD_SHAPES = ((5, 3), (7,), (2, 9))


def _resharded(engine: LoadedEngine, stage: int, optimizer: str, where: Path) -> EngineCase:
    """``RESHARD_SHAPES`` trained 2 steps on the pool, then saved and converted into ``where``."""
    settings: tuple[tuple[str, Any], ...] = (("lr", 0.02), ("momentum", 0.95), ("weight_decay", 0.1))
    if optimizer == "adamw":
        settings = (("betas", (0.9, 0.999)), ("eps", 1e-8), ("lr", 0.02), ("weight_decay", 0.1))
    scatter = engine.declared.scatter_of(optimizer, stage)
    case = EngineCase(
        engine=engine.spec, optimizer=optimizer, stage=stage, accumulate=2,
        reduce_scatter=None if scatter is None else scatter[0], dtype="float32", shapes=RESHARD_SHAPES, no_grad=(), steps=2, seed=0,
        world_size=_world(), settings=settings, save_to=str(where),
    )  # fmt: skip
    return judged(case, engine.declared)


def _on_own_ranks(case: EngineCase, where: Path) -> tuple[list[Comparison], str]:
    """The case on ``case.world_size`` ranks of its own (``harness.engines.phase``): rank 0's
    comparisons, or none and why."""
    (where / "case.pkl").write_bytes(pickle.dumps(case))
    out = where / "comparisons.pkl"
    command = [sys.executable, "-m", "harness.engines.phase", str(where / "case.pkl"), str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    if run.returncode != 0 or not out.exists():
        return [], f"its ranks exited {run.returncode}:\n{run.stderr[-3000:]}"
    return list(pickle.loads(out.read_bytes())), ""


def test_engine_resumes_its_resharded_checkpoint_at_another_world_size_bitwise(
    gate_runner: Any, stage: int, optimizer: str, world: int, tmp_path: Path
) -> None:
    """Trained and saved on the pool's ranks, converted for any world size (``Engine.reshard``),
    loaded on ``world`` ranks of its own (``harness.engines.phase``): every parameter and state tensor equals the
    one-device side's right after the load, and after one more step on the new world's feed."""
    engine = _engine()
    if gate_runner.device != "cpu":
        pytest.skip("engine:reshard: its loads run on CPU ranks of their own")
    gate_runner.subject = _subject()
    gate = f"engine:reshard stage {stage} {optimizer} {_world()}→{world}"
    saved = _resharded(engine, stage, optimizer, tmp_path)
    gate_runner.check(gate, saved, task="engine", exact=True)
    resumed = replace(saved, world_size=world, steps=1, save_to=None,
                      resumed_from=(str(tmp_path / "resharded"), saved.world_size, saved.steps))  # fmt: skip
    comparisons, why = _on_own_ranks(resumed, tmp_path)
    failed = [c for c in comparisons if not c.passed]
    if why or not comparisons:
        message = why or "the resumed run compared nothing"
    else:
        message = f"{len(failed)} of {len(comparisons)} comparisons failed" + "".join(
            f"\n  {c.line()}" for c in failed[:8]
        )
    passed = not why and bool(comparisons) and not failed
    gate_runner.judge(gate, resumed.describe(), passed, message, tier="bitwise", comparisons=comparisons)


@pytest.mark.judges("muongate's engine reshard gate, with a conversion that drops the state", "muongate: gates")
def test_engine_reshard_gate_catches_a_conversion_that_drops_the_optimizer_state(
    gate_runner: Any, tmp_path: Path
) -> None:
    if gate_config().nproc < 2:
        pytest.skip("the control saves on two ranks")
    engine = LoadedEngine.load(f"{flat_engine.__name__}:lossy_reshard_engine")
    saved = replace(_resharded(engine, 1, "muon", tmp_path), world_size=2)
    gate_runner.run(saved, task="engine")
    resumed = replace(saved, world_size=1, steps=1, save_to=None, resumed_from=(str(tmp_path / "resharded"), 2, 2))
    comparisons, why = _on_own_ranks(resumed, tmp_path)
    assert not why, why
    dropped = sorted({c.tensor for c in comparisons if not c.passed})
    gate_runner.judge(
        "negative:engine:lossy_reshard_engine", resumed.describe(), bool(dropped),
        f"caught: {dropped}" if dropped else "not caught: every comparison passed",
        tier="bitwise", comparisons=comparisons,
    )  # fmt: skip
    assert "p0.momentum_buffer" in dropped, dropped


@pytest.mark.judges("muongate's engine gate, with planted engine bugs (negative controls)", "muongate: gates")
@pytest.mark.parametrize("control", sorted(flat_engine.CONTROLS))
def test_engine_gate_catches_planted_engine_bug(gate_runner: Any, control: str) -> None:
    if gate_config().nproc < 2:
        pytest.skip("the controls need two ranks")
    minimal = _caught(gate_runner, f"negative:engine:{control}", f"{flat_engine.__name__}:{control}")
    assert sum(len(s) for s in minimal.shapes) <= 4 and minimal.steps <= 2, minimal.describe()


@pytest.mark.judges(
    "muongate's precision witness, with an engine that reduces in bf16 (negative control)", "muongate: gates"
)
def test_precision_witness_catches_a_bf16_reduction_that_the_exact_feed_cannot_see(gate_runner: Any) -> None:
    """The flat engine all-reducing its float32 gradients in bf16: the precision witness catches it
    and shrinks it; the same minimal case on the exact feed passes, whose sums bf16 holds exactly."""
    if gate_config().nproc < 2:
        pytest.skip("the control needs two ranks")
    spec = f"{flat_engine.__name__}:bf16_reduced_engine"
    minimal = _caught(gate_runner, "negative:engine:bf16_reduced_engine", spec, dtype="float32", witness="precision")
    assert sum(len(s) for s in minimal.shapes) <= 4 and minimal.steps <= 2, minimal.describe()
    _blind_on_the_exact_feed(gate_runner, minimal)


@pytest.mark.judges(
    "muongate's divisor witness, with an engine whose divisor is rounded to a power of two (negative control)",
    "muongate: gates",
)
def test_divisor_witness_catches_a_divisor_that_powers_of_two_hide(gate_runner: Any) -> None:
    """The flat engine dividing each micro-batch's loss by the accumulation count rounded down to a
    power of two: the divisor witness catches it at ×3 and shrinks it; on the exact feed, whose
    counts are powers of two, every cell of it passes."""
    if gate_config().nproc < 2:
        pytest.skip("the control needs two ranks")
    spec = f"{flat_engine.__name__}:shifted_divisor_engine"
    minimal = _caught(gate_runner, "negative:engine:shifted_divisor_engine", spec, dtype="float32", witness="divisor")
    assert minimal.accumulate == 3 and sum(len(s) for s in minimal.shapes) <= 4, minimal.describe()
    for accumulate in (1, 2, 4):
        exact = replace(minimal, witness="exact", accumulate=accumulate)
        assert not differed(gate_runner.run(exact, task="engine")), f"the exact feed at ×{accumulate} saw it"


@pytest.mark.judges(
    "muongate's rank-asymmetric feed, with an engine whose owner skips a gradient it lacks (negative control)",
    "muongate: gates",
)
def test_asymmetric_feed_catches_an_owner_that_skips_a_gradient_only_it_lacks(gate_runner: Any) -> None:
    """The flat engine's owner skipping a parameter without a gradient on its own rank, though
    another rank's reached it: the asymmetric feed catches it; every rank's gradient, on the same
    minimal case, hides it."""
    if gate_config().nproc < 2:
        pytest.skip("the control needs two ranks")
    spec = f"{flat_engine.__name__}:owner_skips_engine"
    minimal = _caught(gate_runner, "negative:engine:owner_skips_engine", spec, asymmetric=True)
    assert minimal.missing_on and minimal.steps <= 2, minimal.describe()
    assert not differed(gate_runner.run(replace(minimal, missing_on=()), task="engine")), "seen without the asymmetry"


DEEPSPEED = "examples.deepspeed_adapter:deepspeed_zero"


@pytest.mark.judges("muongate's engine gate against the reference, with bugs planted in DeepSpeed", "muongate: gates")
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("control", ["momentum_restarted"])
def test_engine_gate_catches_a_planted_deepspeed_bug_against_the_reference(
    gate_runner: Any, control: str, stage: int
) -> None:
    """Under ``--engine examples.deepspeed_adapter:deepspeed_zero``: DeepSpeed with a bug planted
    after its own step (``examples/deepspeed_planted_bugs.py``) fails against ``reference.Muon``
    on DeepSpeed's conventions, at every stage."""
    if _engine().spec != DEEPSPEED:
        pytest.skip(f"plants its bugs in DeepSpeed: runs under --engine {DEEPSPEED}")
    if gate_config().nproc < 2:
        pytest.skip("the controls need two ranks")
    # on every rank: DeepSpeed talks over the default process group
    minimal = _caught(
        gate_runner, f"negative:engine:deepspeed {control} stage {stage}", f"examples.deepspeed_planted_bugs:{control}",
        _world(), stage=stage, optimizer="muon", dtype="float32",
    )  # fmt: skip
    assert minimal.against == "reference", minimal.describe()


MEGATRON = "examples.megatron_adapter:megatron_ddp"


@pytest.mark.judges(
    "muongate's engine gate against the reference, with bugs planted in Megatron-core", "muongate: gates"
)
@pytest.mark.parametrize("stage", [0, 1])
@pytest.mark.parametrize("control", ["last_rank_state_lost"])
def test_engine_gate_catches_a_planted_megatron_bug_against_the_reference(
    gate_runner: Any, control: str, stage: int
) -> None:
    """Under ``--engine examples.megatron_adapter:megatron_ddp``: Megatron with a bug planted after
    its own step (``examples/megatron_planted_bugs.py``) fails against ``reference.AdamW`` at both stages."""
    if _engine().spec != MEGATRON:
        pytest.skip(f"plants its bugs in Megatron-core: runs under --engine {MEGATRON}")
    minimal = _caught(
        gate_runner, f"negative:engine:megatron {control} stage {stage}", f"examples.megatron_planted_bugs:{control}",
        gate_config().nproc, stage=stage, optimizer="adamw", dtype="float32",
    )  # fmt: skip
    assert minimal.against == "reference", minimal.describe()


@pytest.mark.judges(
    "muongate's precision witness against the reference, with DeepSpeed told to communicate in bf16", "muongate: gates"
)
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_precision_witness_catches_a_planted_deepspeed_bf16_communication(gate_runner: Any, stage: int) -> None:
    """Under ``--engine examples.deepspeed_adapter:deepspeed_zero``: DeepSpeed with
    ``communication_data_type: bf16`` and float32 parameters (``examples/deepspeed_planted_bugs.py``)
    is caught by the precision witness at stages 0 to 2, where the exact feed passes the same
    minimal case."""
    if _engine().spec != DEEPSPEED:
        pytest.skip(f"plants its bug in DeepSpeed: runs under --engine {DEEPSPEED}")
    if gate_config().nproc < 2:
        pytest.skip("the control needs two ranks")
    minimal = _caught(
        gate_runner, f"negative:engine:deepspeed bf16_communication stage {stage}",
        "examples.deepspeed_planted_bugs:bf16_communication", _world(), stage=stage, dtype="float32",
        witness="precision",
    )  # fmt: skip
    _blind_on_the_exact_feed(gate_runner, minimal)
