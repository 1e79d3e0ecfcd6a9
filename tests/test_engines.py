"""Claims about the engine contract (``harness.engines``): declarations are checked when made,
the feed's gradients are exact in any order of summation, ``--engine`` is refused where it
cannot work, and DeepSpeed's ZeRO rows (``examples/deepspeed_adapter.py``) say what its
stages do on the dev profile: the CPU CI runs them (they skip, naming the extra, where
DeepSpeed is not installed)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import ENGINES, repo_env, run_pytest, run_python

from harness.engines import Engine, LoadedEngine
from harness.engines.case import EngineCase, engine_cases

DEEPSPEED = "examples.deepspeed_adapter:deepspeed_zero"


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"stages": ()}, "stages"),
        ({"stages": {1}, "optimizers": "muon"}, "optimizers"),
        ({"stages": {1}, "optimizers": {"sgd"}}, "optimizers"),
        ({"stages": {1}, "judged": {"muon": "self"}}, "single_device"),
        ({"stages": {1}, "accumulate": (0,)}, "accumulate"),
        ({"stages": {1}, "reduce_scatter": {3: (True,)}}, "reduce_scatter"),
        ({"stages": {1}, "dtypes": {"float16"}}, "dtypes"),
        ({"stages": {1}, "reshard_stages": {1}}, "reshard"),
        ({"stages": {1}, "shown": {"muon"}}, "single_device"),
        ({"stages": {1}, "judged": {"muon": "self"}, "single_device": print, "shown": {"muon"}}, "shown"),
        ({"stages": {1}, "conventions": 3}, "conventions"),
        ({"stages": {1}, "options": {"sgd": {"x": (1,)}}}, "options"),
        ({"stages": {1}, "options": {"muon": {"x": ()}}}, "options"),
        ({"stages": {1}, "optimizers": {"adamw"}, "per_head": "per_head_muon"}, "per_head"),
        ({"stages": {1}, "per_head": True}, "per_head"),
        ({"stages": {1}, "clip": "divide"}, "clip"),
    ],
)
def test_an_engine_declaration_refuses_a_bad_field_by_name(fields: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        Engine(**fields)


FLAT = LoadedEngine.load("gates.examples.flat_engine:flat_engine")


@given(case=engine_cases(FLAT.spec, FLAT.declared, 4))
@settings(max_examples=50, deadline=None)
def test_the_feed_s_mean_gradient_is_the_same_bits_in_bf16_in_any_order_of_summation(case) -> None:
    """What makes the engine gates bitwise: every engine sums the same exact values, in bf16
    too, here in the reverse of the order the one-device side sums them."""
    for name, expected in case.mean_gradient(0).items():
        pieces = [
            case.feed(0, rank, micro)[name].to(torch.bfloat16) / case.accumulate
            for rank in range(case.world_size)
            for micro in range(case.accumulate)
        ]
        backwards = torch.zeros_like(pieces[0])
        for piece in reversed(pieces):
            backwards = backwards + piece
        assert torch.equal((backwards / case.world_size).float(), expected), name


@pytest.mark.parametrize("profile", ["dev", "ci"])
def test_every_engine_cell_tries_a_matrix_that_straddles_two_partitions_first_in_every_profile(profile: str) -> None:
    """The straddling case (``STRADDLE``, with ``reduce_scatter`` on where the cell takes it) is the
    first case of every cell, so that a profile of 20 cases cannot miss a split-matrix reduction
    bug (DeepSpeed 0.19.2's, matrix finding 26)."""
    from hypothesis import HealthCheck

    from harness.engines.case import STRADDLE

    seen: list[Any] = []
    declared = replace(FLAT.declared, reduce_scatter={1: (True, False)})  # as DeepSpeed declares stage 1
    drawn = engine_cases(FLAT.spec, declared, 2, stage=1, optimizer="muon", accumulate=1, dtype="float32")

    @settings(settings.get_profile(profile), max_examples=2, database=None, suppress_health_check=list(HealthCheck))
    @given(case=drawn)
    def first(case: Any) -> None:
        seen.append(case)

    first()
    assert seen[0].shapes == STRADDLE and seen[0].reduce_scatter is True, seen[0]


@pytest.mark.slow
def test_engine_with_impl_or_a_bad_engine_spec_is_a_usage_error(tmp_path: Path) -> None:
    for args, said in (
        (["--engine", DEEPSPEED, "--impl", "gates.examples.gathered_muon:gathered_muon"], "--engine with --impl"),
        (["--engine", "gates.examples.gathered_muon:gathered_muon"], "declares no harness.engines.Engine"),
    ):
        run = run_python(
            "-m", "pytest", "--pyargs", "gates.test_engine_gates", "-q", "-p", "no:cacheprovider", *args,
            cwd=tmp_path, env=repo_env(), timeout=300,
        )  # fmt: skip
        assert run.returncode == 4 and said in run.stderr, run.stderr[-2000:]


def _engine_session(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_python(
        "-m", "pytest", "--pyargs", "gates.test_engine_gates", "-m", "gate", "--nproc", "2", "-q",
        "-p", "no:cacheprovider", "-p", "no:randomly", "--hypothesis-profile", "dev", "--hypothesis-seed", "0",
        "--gate-report", str(tmp_path / "report"), *args,
        cwd=tmp_path, env=repo_env(), timeout=900,
    )  # fmt: skip


@pytest.mark.slow
def test_the_flat_engine_passes_every_engine_gate_and_each_planted_engine_bug_is_caught(tmp_path: Path) -> None:
    run = _engine_session(tmp_path, "--engine", "gates.examples.flat_engine:flat_engine")
    assert run.returncode == 0, run.stdout[-4000:]
    gates = json.loads((tmp_path / "report" / "figures.json").read_text())["gates"]
    for control in ("sliced_engine", "per_micro_batch_engine", "partly_reduced_engine"):
        assert re.search(rf"engine:{control}\s+yes", run.stdout), run.stdout[-4000:]
    assert {"engine:reshard stage 1 muon 2→1", "engine:reshard stage 1 adamw 2→4"} <= set(gates), sorted(gates)
    assert gates["negative:engine:lossy_reshard_engine"]["failed_cases"] == 0, sorted(gates)


@pytest.mark.slow
def test_a_session_without_engine_runs_no_engine_gate_and_one_with_it_no_other_gate(tmp_path: Path) -> None:
    without = run_python(
        "-m", "pytest", "--pyargs", "gates.test_engine_gates", "gates.test_reshard_gates", "--co",
        "-q", "-p", "no:cacheprovider", "--nproc", "2",
        cwd=tmp_path, env=repo_env(), timeout=300,
    )  # fmt: skip
    assert "test_engine_" not in without.stdout and "test_checkpoint_resharded" in without.stdout, without.stdout
    with_engine = run_python(
        "-m", "pytest", "--pyargs", "gates.test_engine_gates", "gates.test_reshard_gates", "--co",
        "-q", "-p", "no:cacheprovider", "--nproc", "2", "--engine", "gates.examples.flat_engine:flat_engine",
        cwd=tmp_path, env=repo_env(), timeout=300,
    )  # fmt: skip
    assert "test_engine_steps_like" in with_engine.stdout, with_engine.stdout
    assert "test_checkpoint_resharded" not in with_engine.stdout, with_engine.stdout


@pytest.mark.slow
@pytest.mark.peers
def test_deepspeed_rows_run_every_cell_and_show_its_stage_0_bf16_extra_step(tmp_path: Path) -> None:
    """All 48 cells run; AdamW, judged against reference.AdamW, is bitwise at stages 1–3 in
    float32 and bf16 and at stage 0 in float32; stage 0's bf16 cells fail (its extra step at
    start-up, examples/findings/deepspeed_bf16_stage0_extra_step.py). AdamW's universal
    checkpoint of stage 1, saved on 2 ranks, resumes bitwise on 1 and on 4 (stages 2 and 3 do
    too, in the matrix's run: here stage 1 alone, for CI's time)."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip(f"needs {ENGINES}")
    run = _engine_session(tmp_path, "--engine", DEEPSPEED, "-k", "steps_like or (resumes and stage1-adamw)")
    gates = json.loads((tmp_path / "report" / "figures.json").read_text())["gates"]
    resharded = {name for name in gates if "reshard" in name}
    assert resharded == {f"engine:reshard stage 1 adamw 2→{w}" for w in (1, 4)}, sorted(gates)
    assert resharded <= {name for name, g in gates.items() if g["failed_cases"] == 0}, run.stdout[-3000:]
    gates = {name: g for name, g in gates.items() if name not in resharded}
    assert len(gates) == 48, (sorted(gates), run.stdout[-3000:])
    passed = {name for name, g in gates.items() if g["failed_cases"] == 0}
    adamw = {name for name in gates if "adamw" in name and not ("stage 0" in name and "bfloat16" in name)}
    assert adamw <= passed, (sorted(adamw - passed), run.stdout[-3000:])
    stage0_bf16 = {name for name in gates if "stage 0" in name and "bfloat16" in name}
    assert not stage0_bf16 & passed, run.stdout[-3000:]
    # Muon is judged against reference.Muon on DeepSpeed's conventions, its own one-device
    # optimizer shown beside: both bitwise in float32 at every stage
    muon = {name for name in gates if "muon" in name and "float32" in name}
    assert muon <= passed, (sorted(muon - passed), run.stdout[-3000:])
    assert all(set(gates[name]["verdicts"]) == {"reference", "self"} for name in muon), run.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.peers
def test_deepspeed_per_head_muon_is_bitwise_at_stages_1_to_3_and_dropped_at_stage_0(tmp_path: Path) -> None:
    """``"per_head_muon": true`` on a query projection the model's config describes: bitwise
    against reference.Muon with ``ns_heads`` at stages 1, 2 and 3; red at stage 0, where DeepSpeed
    orthogonalizes the whole matrix (examples/findings/deepspeed_per_head_muon_dropped.py), while
    its own one-device optimizer, which is never given the head count, agrees with the engine."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip(f"needs {ENGINES}")
    _engine_session(tmp_path, "--engine", DEEPSPEED, "-k", "each_head")
    gates = json.loads((tmp_path / "report" / "figures.json").read_text())["gates"]
    failed = {name for name, g in gates.items() if g["failed_cases"]}
    assert set(gates) == {f"engine:per-head stage {s}" for s in range(4)} and failed == {"engine:per-head stage 0"}
    compared, agreed = gates["engine:per-head stage 0"]["verdicts"]["self"]
    assert compared == agreed, gates["engine:per-head stage 0"]


@pytest.mark.slow
@pytest.mark.peers
def test_deepspeed_clipping_is_bitwise_for_adamw_and_clips_muon_s_update_at_stages_1_to_3(tmp_path: Path) -> None:
    """``"gradient_clipping"`` at ZeRO 1–3: AdamW steps bit for bit on the gradients scaled by the
    norm DeepSpeed reports; Muon's cells fail, since DeepSpeed measures and clips the orthogonalized
    update (examples/findings/deepspeed_muon_clips_the_update.py); stage 0 reports no norm and skips."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip(f"needs {ENGINES}")
    run = _engine_session(tmp_path, "--engine", DEEPSPEED, "-k", "clips_by")
    gates = json.loads((tmp_path / "report" / "figures.json").read_text())["gates"]
    failed = {name for name, g in gates.items() if g["failed_cases"]}
    assert set(gates) == {f"engine:clip stage {s} {o}" for s in (1, 2, 3) for o in ("adamw", "muon")}, sorted(gates)
    assert failed == {f"engine:clip stage {s} muon" for s in (1, 2, 3)}, run.stdout[-3000:]
    assert "reports no clipping norm at stage 0" in run.stdout, run.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.peers
def test_reference_muon_on_deepspeed_s_conventions_steps_as_its_single_device_muon_bit_for_bit() -> None:
    """Every ns_method the installed release takes, ten shapes from 1×1 to 64×24, three steps
    with weight decay, the Adam half beside (examples/deepspeed_reference_settings.py)."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip(f"needs {ENGINES}")
    run = run_python("-m", "examples.deepspeed_reference_settings", env=repo_env(), timeout=600)
    lines = [line for line in run.stdout.splitlines() if line.startswith("deepspeed ")]
    assert run.returncode == 0 and len(lines) >= 10, run.stdout[-3000:] + run.stderr[-3000:]
    assert all(": bitwise;" in line for line in lines), run.stdout


@pytest.mark.slow
def test_the_deepspeed_adapter_refuses_a_release_without_muon_in_one_line_naming_it(tmp_path: Path) -> None:
    """A DeepSpeed before 0.17.6 (here a stand-in package of that version, without
    deepspeed/runtime/zero/muon/) is a usage error naming the release and why."""
    (tmp_path / "deepspeed").mkdir()
    (tmp_path / "deepspeed" / "__init__.py").write_text('__version__ = "0.17.5"\n')
    run = run_python(
        "-m", "pytest", "--pyargs", "gates.test_engine_gates", "--co", "-q", "-p", "no:cacheprovider",
        "--nproc", "2", "--engine", DEEPSPEED,
        cwd=tmp_path, env=repo_env(tmp_path), timeout=300,
    )  # fmt: skip
    said = "DeepSpeed 0.17.5 has no Muon (deepspeed/runtime/zero/muon/ arrived in 0.17.6)"
    assert run.returncode == 4 and said in run.stderr, run.stderr[-2000:]
    assert len([line for line in run.stderr.splitlines() if said in line]) == 1, run.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.peers
def test_a_bug_planted_in_deepspeed_fails_the_engine_gate_against_the_reference_at_every_stage(
    tmp_path: Path,
) -> None:
    """Muon's momentum zeroed after each DeepSpeed step, and DeepSpeed communicating in bf16 under
    float32 (examples/deepspeed_planted_bugs.py)."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip(f"needs {ENGINES}")
    run = _engine_session(tmp_path, "--engine", DEEPSPEED, "-k", "planted_deepspeed", "--allow-unjudged")
    assert run.returncode == 0 and "7 passed" in run.stdout, run.stdout[-4000:]
    for stage in range(4):
        assert re.search(rf"engine:deepspeed momentum_restarted stage {stage}\s+yes", run.stdout), run.stdout[-4000:]
    for stage in range(3):  # communication_data_type bf16: the precision witness's, the exact feed passing
        assert re.search(rf"engine:deepspeed bf16_communication stage {stage}\s+yes", run.stdout), run.stdout[-4000:]


def test_a_case_judged_against_the_reference_is_named_by_it_when_the_engines_own_optimizer_shown_beside_it_differs_too() -> (
    None
):
    """An engine's one-device optimizer, shown beside the reference (``Engine.shown``), does not
    decide the verdict, so it does not name the finding either; under --against self it does, and
    a stream written before the case said what it rested on reads as it did (self first)."""
    from reports.records import CaseResult, Comparison

    both = (Comparison("w", (2, 2), bitwise=False, passed=False), Comparison("w", (2, 2), passed=False, against="self"))
    assert (
        CaseResult(1, "engine", "c", "failed", comparisons=both, against="reference").finding
        == "differs from reference"
    )
    assert CaseResult(1, "engine", "c", "failed", comparisons=both, against="self").finding == "differs from itself"
    assert CaseResult(1, "engine", "c", "failed", comparisons=both).finding == "differs from itself"


def test_the_megatron_adapter_declares_itself_without_megatron_and_refuses_a_machine_without_a_gpu_in_one_line() -> (
    None
):
    """Its declaration loads where megatron-core is not installed (the package is imported by the
    factory alone), and the factory refuses a machine without a GPU before it touches Megatron."""
    from examples.megatron_adapter import refusal

    declared = LoadedEngine.load("examples.megatron_adapter:megatron_ddp").declared
    assert declared.stages == (0, 1) and declared.optimizers == {"adamw"}
    assert declared.reshard_stages == (0,) and declared.missing_gradient == "zeros"
    assert refusal(1) is None
    why = refusal(0)
    assert why is not None and "\n" not in why and "needs a GPU" in why and "CUDA" in why


def test_an_engine_is_refused_in_one_line_where_its_package_is_missing_or_its_device_is_not_declared() -> None:
    """Megatron without megatron-core was 18 red gates and their tracebacks; now the session refuses
    it before any rank starts (``GateSession._engine``), naming the package or the device."""
    megatron = LoadedEngine.load("examples.megatron_adapter:megatron_ddp")
    said = megatron.refusal("cuda")
    if importlib.util.find_spec("megatron") is None:
        assert said == (
            "drives megatron-core==0.19.2, which is not installed here: pip install 'megatron-core==0.19.2' "
            "(docs/pages/engines.md)"
        )
    else:
        assert said is None
        assert megatron.refusal("cpu") == (
            "runs its ranks on cuda only, and this session's are on cpu: try --gate-device cuda"
        )
    assert megatron.declared.devices == {"cuda"}
    assert LoadedEngine.load("gates.examples.flat_engine:flat_engine").refusal("cpu") is None, "muongate's own"
    with pytest.raises(ValueError, match="Engine devices: unknown"):
        Engine(stages={0}, devices={"tpu"})


def test_a_session_refuses_megatron_without_megatron_core_in_one_line(other_project: pytest.Pytester) -> None:
    if importlib.util.find_spec("megatron") is not None:
        pytest.skip("megatron-core is installed here")
    result = run_pytest(
        other_project, "-p", "harness.plugin", "--pyargs", "gates.test_engine_gates", "-m", "gate",
        "--engine", "examples.megatron_adapter:megatron_ddp", "--nproc", "2", timeout=120,
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    said = [line for line in result.errlines if line.strip()]
    assert said == [
        "ERROR: --engine examples.megatron_adapter:megatron_ddp: drives megatron-core==0.19.2, which is not "
        "installed here: pip install 'megatron-core==0.19.2' (docs/pages/engines.md)"
    ], said


def _flat_case(**given: Any) -> EngineCase:
    """A one-step float32 AdamW case of muongate's flat engine, with ``given`` on top."""
    return EngineCase(
        engine="gates.examples.flat_engine:flat_engine", optimizer="adamw", stage=1, reduce_scatter=None,
        dtype="float32", no_grad=(), steps=1, settings=(), **given,
    )  # fmt: skip


def test_the_precision_witness_is_exact_in_float32_and_rounds_in_bf16_and_is_refused_for_bf16_cases() -> None:
    """The feed the precision gate draws: every sum over ranks and micro-batches is exact in float32
    (the mean equals float64's), bf16 rounds the feed itself, and a bf16 case cannot carry it."""
    case = _flat_case(accumulate=4, shapes=((8, 8),), seed=3, world_size=8, witness="precision")
    feeds = [case.feed(0, r, m)["p0"] for r in range(8) for m in range(4)]
    exact = torch.stack([f.double() for f in feeds]).sum(0) / 32
    assert torch.equal(case.mean_gradient(0)["p0"].double(), exact)
    assert not torch.equal(feeds[0].bfloat16().float(), feeds[0]), "bf16 holds the witness: it would see nothing"
    assert torch.equal(
        replace(case, witness="exact").feed(0, 0, 0)["p0"].bfloat16().float(),
        replace(case, witness="exact").feed(0, 0, 0)["p0"],
    )
    with pytest.raises(ValueError, match="needs float32 gradients"):
        replace(case, dtype="bfloat16")


@pytest.mark.parametrize(("world", "accumulate"), [(3, 1), (2, 3), (5, 2), (6, 5), (3, 3)])
def test_the_divisor_witness_keeps_every_division_exact_and_its_mean_with_it(world: int, accumulate: int) -> None:
    """Each micro-batch's gradient divided by the count or multiplied by its reciprocal, before
    or after the sum over ranks, is the float64 mean; a divisor rounded to a power of two is not."""
    case = _flat_case(accumulate=accumulate, shapes=((6, 7),), seed=5, world_size=world, witness="divisor")
    feeds = [[case.feed(0, r, m)["p0"] for m in range(accumulate)] for r in range(world)]
    exact = torch.stack([f.double() for rank in feeds for f in rank]).sum(0) / (world * accumulate)
    mean = case.mean_gradient(0)["p0"]
    assert torch.equal(mean.double(), exact)
    reciprocal = torch.tensor(1.0) / accumulate
    scaled = [sum(f * reciprocal for f in rank) for rank in feeds]  # a loss scaled by 1/accumulate
    assert torch.equal(sum(scaled) / world, mean)
    assert torch.equal(sum(s / world for s in scaled), mean)  # divided before the reduction
    shifted = 1 << ((world * accumulate).bit_length() - 1)
    assert not torch.equal(exact.float() * (world * accumulate) / shifted, mean)


def test_the_divisor_witness_refuses_powers_of_two_bf16_and_counts_whose_reciprocal_rounds() -> None:
    case = _flat_case(accumulate=3, shapes=((2, 2),), seed=0, world_size=2, witness="divisor")
    with pytest.raises(ValueError, match="must not be a power of two"):
        replace(case, accumulate=2)
    with pytest.raises(ValueError, match="accumulate=7: its reciprocal rounds"):
        replace(case, accumulate=7)
    with pytest.raises(ValueError, match="needs float32 gradients"):
        replace(case, dtype="bfloat16")
    with pytest.raises(ValueError, match="other counts are the divisor witness's"):
        replace(case, witness="exact")


def test_a_gradient_missing_on_some_ranks_counts_as_zeros_in_the_mean_and_is_refused_on_every_rank() -> None:
    case = _flat_case(accumulate=2, shapes=((2, 3), (4,)), seed=1, world_size=4, missing_on=((0, 1), (0, 3)))
    assert "p0" not in case.feed(0, 1, 0) and "p0" in case.feed(0, 2, 1) and "p1" in case.feed(0, 1, 0)
    fed = torch.stack([case.feed(0, r, m)["p0"] for r in (0, 2) for m in range(2)]).sum(0)
    assert torch.equal(case.mean_gradient(0)["p0"], fed / 8)
    assert "p0 without a gradient on ranks 1, 3" in case.describe()
    with pytest.raises(ValueError, match="p0 on every rank; that is no_grad"):
        replace(case, missing_on=tuple((0, r) for r in range(4)))
    with pytest.raises(ValueError, match="a parameter with a gradient and a rank of the case"):
        replace(case, missing_on=((0, 4),))


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_an_engine_that_needs_the_same_gradients_on_every_rank_gets_symmetric_cases_and_says_so(data: Any) -> None:
    """``Engine.needs_same_grads``: its rank-asymmetric cases are narrowed to symmetric ones where
    it says so (stage 1 here), while a parameter no rank's loss reaches is still drawn."""
    declared = replace(FLAT.declared, stages={0, 1}, needs_same_grads=lambda config: config.stage == 1)
    case = data.draw(engine_cases(FLAT.spec, declared, 2, checkpoint=False, asymmetric=True))
    if case.stage == 1:
        assert case.missing_on == () and "the same parameters" in case.describe()
    else:
        assert case.missing_on and not case.narrowed
    with pytest.raises(ValueError, match="needs_same_grads=True: a function of the case's config"):
        replace(FLAT.declared, needs_same_grads=True)


@pytest.mark.peers
@pytest.mark.parametrize("stage", [1, 3])
def test_a_deepspeed_engine_builds_again_after_a_failed_case_made_its_ranks_groups_afresh(stage: int) -> None:
    """A case that raised on every rank leaves the ranks in place with new process groups (the
    pool's regroup); DeepSpeed keeps the groups it made in module globals, and the next engine
    built on them asked torch for a destroyed group's ranks (one H100, 2026-12-07). The same
    case passes before and after the regroup (examples/deepspeed_adapter.py,
    ``forget_destroyed_groups``)."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip(f"needs {ENGINES}")
    from harness.engines.case import judged
    from harness.ranks import RankPool
    from harness.runner import RANK_PRELOAD
    from harness.tasks import selftest
    from harness.tasks.engine import run_engine_case

    settings_ = (("betas", (0.9, 0.95)), ("eps", 1e-8), ("lr", 0.02), ("weight_decay", 0.0))
    case = EngineCase(engine=DEEPSPEED, optimizer="adamw", stage=stage, accumulate=1, reduce_scatter=None,
                      dtype="float32", shapes=((4, 3), (5,)), no_grad=(), steps=1, seed=1, world_size=2,
                      settings=settings_)  # fmt: skip
    case = judged(case, LoadedEngine.load(DEEPSPEED).declared)
    with RankPool(2, preload=RANK_PRELOAD, case_timeout_s=120, pg_timeout_s=60) as pool:
        before = pool.run(run_engine_case, case)
        assert before.ok, before.failure
        regroups = pool.regroups
        assert not pool.run(selftest.raise_on_every_rank).ok
        assert pool.regroups == regroups + 1
        after = pool.run(run_engine_case, case)
        assert after.ok, after.failure
    assert all(c.passed for result in after.results for c in result.comparisons)
