"""Claims: FSDP2 + the sharded optimizer trains a small transformer exactly like one process, and it learns.

The reference is the session's: ``reference.Muon``, or the one an ``--impl`` candidate names
(``reference.AdamW`` for torch's AdamW), on that reference's defaults.

Both sides compute their own gradients (``harness.tasks.training``): the sharded model on each
rank's micro-batch, the single-process reference on every rank's micro-batch, stepping on
their mean. Losses, gradients, parameters and optimizer state are compared after every
step: bitwise on 2 ranks (FSDP2 averages two gradients, which is order-independent), the
``reduction_order`` tolerance tier beyond. The data is Python's own documentation text
(``harness.models.transformer``), one token per byte, so losses are reported in bits per byte.

A gate that a model which does not learn could pass would prove little, so the
held-out bits per byte must fall; and a planted off-by-one shard boundary in the
distributed step must fail the gate (this family's negative control).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import strategies as st

import reference
from gates.adamw_controls import L2DecayAdamW
from gates.negative_controls import OffByOneRowsMuon
from gates.step_controls import (
    DecayedOnResumeTransformer,
    DroppedMicroBatchTransformer,
    DroppedMomentTransformer,
    LastMicroBatchPipeline,
    NarrowReduceTransformer,
    OldDivisorOnResumeTransformer,
    RestartedScheduleTransformer,
    ShardGroupOnlyTransformer,
    SummedPipeline,
    SummedReduceTransformer,
)
from harness.layouts import FSDP_TP
from harness.models.step import Accumulation, Precision, Resume
from harness.models.transformer import Mlp, TransformerCase
from harness.runner.ran import differed
from harness.session import gate_config
from harness.tasks.pipeline import SCHEDULES, PipelineCase
from harness.tasks.training import TwinsCase

pytestmark = pytest.mark.gate


CASES = {
    "dense": TransformerCase("dense MLP, separate Q K V", steps=12),
    "dense-fused-qkv": TransformerCase("dense MLP, fused QKV", fused_qkv=True, steps=12),
    "moe": TransformerCase("MoE MLP (fixed), learned routing", mlp="moe", steps=12),
}


@pytest.mark.parametrize("name", list(CASES))
def test_training_matches_single_process_reference_at_every_step(gate_runner: Any, name: str) -> None:
    gate_runner.reference_only("training")
    case = CASES[name]
    gate_runner.train("training", case if gate_config().nproc == 2 else _on(case, min(gate_config().nproc, 4)))


def test_training_learns_held_out_bits_per_byte_fall(gate_runner: Any) -> None:
    gate_runner.reference_only("training:learns")
    case = TransformerCase("learning check, dense MLP", steps=30)
    start, end = gate_runner.train("training:learns", case)["held_out_bits"]
    assert end < start - 1.0, f"held-out bits per byte went from {start:.3f} to {end:.3f}: the model did not learn"


@pytest.mark.judges("the training gate, with a planted off-by-one shard boundary (negative control)", "muongate: gates")
def test_training_gate_catches_off_by_one_shard_boundary(gate_runner: Any) -> None:
    planted = TransformerCase("planted off-by-one rows", steps=2, candidate=OffByOneRowsMuon)
    _caught(gate_runner, "negative:training:OffByOneRowsMuon", planted)


def _on(case: TransformerCase, world: int) -> TransformerCase:
    return replace(case, world_size=world)


def _caught(gate_runner: Any, gate: str, planted: Any, task: str = "training") -> None:
    """A planted training case (a known-wrong optimizer or layout), run once by ``task``: the
    gate must find it differs."""
    gate_runner.catch(
        gate, st.just(planted), lambda case: differed(gate_runner.run(case, task=task)), type(planted).describe,
        max_examples=1,
    )  # fmt: skip


# -- mixed precision: FSDP2's MixedPrecisionPolicy and autocast (harness/models/step.py) --
PRECISIONS = {
    "bf16-params-fp32-reduce": Precision(param="bfloat16", reduce="float32"),
    "bf16-params-bf16-reduce": Precision(param="bfloat16"),
    "bf16-autocast": Precision(autocast="bfloat16"),
}


def _mixed(name: str, steps: int = 4) -> TransformerCase:
    return TransformerCase(f"dense MLP, {name}", steps=steps, precision=PRECISIONS[name])


@pytest.mark.parametrize("name", list(PRECISIONS))
def test_mixed_precision_training_matches_single_process_reference_at_every_step(gate_runner: Any, name: str) -> None:
    """FSDP2 with a mixed-precision policy (or autocast) against one process that follows the
    same declaration: its forward and backward on parameters cast as FSDP2 casts them, its
    gradients reduced in the declared dtype. Bitwise on 2 ranks."""
    gate_runner.reference_only("training:precision")
    world = min(gate_config().nproc, 4)
    gate_runner.train("training:precision", _on(_mixed(name), world))


@pytest.mark.parametrize("name", list(PRECISIONS))
def test_mixed_precision_training_twins_agree_bitwise(gate_runner: Any, name: str) -> None:
    """The twins under each mixed-precision declaration at the session's world size, two
    micro-batches accumulated per step: the candidate steps on the float32 gradients FSDP2
    reduced, as the reference twin does."""
    gate_runner.reference_only("training:precision:twins")
    case = TwinsCase(_on(_mixed(name, steps=2), gate_config().nproc), accumulate=2)
    gate_runner.check("training:precision:twins", case, task="twins")


# -- accumulation, and HSDP (harness/models/step.py) ----------------------------------------
#: (micro-batches, sync, precision): FSDP2's reductions across a step's micro-batches
ACCUMULATIONS = {
    "3-micro-every": (3, "every", "fp32"),
    "3-micro-last": (3, "last", "fp32"),
    "2-micro-last-bf16-params-fp32-reduce": (2, "last", "bf16-params-fp32-reduce"),
    "2-micro-last-bf16-params-bf16-reduce": (2, "last", "bf16-params-bf16-reduce"),
}
#: HSDP on (2, 2) at 4 ranks: every mean of two ranks, so bitwise
HSDP_STEPS = {
    "2-micro-every": (2, "every", "fp32"),
    "2-micro-last": (2, "last", "fp32"),
    "2-micro-last-all-reduce": (2, "last_all_reduce", "fp32"),
    "2-micro-last-all-reduce-bf16-params-fp32-reduce": (2, "last_all_reduce", "bf16-params-fp32-reduce"),
}


def _accumulated(name: str, micro: int, sync: str, precision: str, **fields: Any) -> TransformerCase:
    declared = Precision() if precision == "fp32" else PRECISIONS[precision]
    return TransformerCase(
        f"dense MLP, {name}", steps=3, precision=declared, accumulation=Accumulation(micro, sync), **fields
    )


@pytest.mark.parametrize("name", list(ACCUMULATIONS))
def test_accumulated_training_matches_single_process_reference(gate_runner: Any, name: str) -> None:
    """Micro-batches accumulated with FSDP2 reducing each one, or only their sum
    (``set_requires_gradient_sync``), in float32 and under mixed precision, against one process
    that accumulates and reduces as declared. Bitwise on 2 ranks."""
    gate_runner.reference_only("training:accumulation")
    case = _accumulated(name, *ACCUMULATIONS[name])
    gate_runner.train("training:accumulation", _on(case, min(gate_config().nproc, 4)))


@pytest.mark.parametrize("name", list(HSDP_STEPS))
def test_hsdp_training_matches_single_process_reference_bitwise(gate_runner: Any, name: str) -> None:
    """HSDP on a (2, 2) mesh: FSDP2 reduce-scatters within each replica and all-reduces across
    them, every micro-batch, only the last (``set_requires_gradient_sync``), or reduce-scatters
    every micro-batch and all-reduces the last (``set_requires_all_reduce``); one process takes
    the same means in the same order, so every comparison is bitwise."""
    gate_runner.reference_only("training:hsdp")
    if gate_config().nproc < 4:
        pytest.skip("needs --nproc 4")
    gate_runner.train("training:hsdp", _accumulated(name, *HSDP_STEPS[name], world_size=4, replicate=2))


@pytest.mark.judges(
    "the accumulation training gate, with a layout that sums the ranks' gradients where their mean is due "
    "(negative control)",
    "muongate: gates",
)
def test_accumulated_training_gate_catches_a_sum_where_a_mean_is_due(gate_runner: Any) -> None:
    planted = SummedReduceTransformer(
        "planted sum where a mean is due", steps=1, accumulation=Accumulation(2, "last"),
        world_size=min(gate_config().nproc, 4),
    )  # fmt: skip
    _caught(gate_runner, "negative:training:accumulation:SummedReduceTransformer", planted)


@pytest.mark.judges(
    "the accumulation training gate, with a layout that clears the gradients before each micro-batch "
    "(negative control)",
    "muongate: gates",
)
def test_accumulated_training_gate_catches_a_dropped_micro_batch(gate_runner: Any) -> None:
    planted = DroppedMicroBatchTransformer(
        "planted gradients cleared before each micro-batch", steps=1, accumulation=Accumulation(2, "every"),
        world_size=min(gate_config().nproc, 4),
    )  # fmt: skip
    _caught(gate_runner, "negative:training:accumulation:DroppedMicroBatchTransformer", planted)


@pytest.mark.judges(
    "the HSDP training gate, with a layout that reduces over the shard group only (negative control)",
    "muongate: gates",
)
def test_hsdp_training_gate_catches_a_mean_over_the_shard_group_only(gate_runner: Any) -> None:
    if gate_config().nproc < 4:
        pytest.skip("needs --nproc 4")
    planted = ShardGroupOnlyTransformer("planted mean over the shard group only", steps=1, world_size=4, replicate=2)
    _caught(gate_runner, "negative:training:hsdp:ShardGroupOnlyTransformer", planted)


@pytest.mark.judges(
    "the mixed-precision training gate, with a layout that reduces in bf16 under a float32-reduce "
    "policy (negative control)",
    "muongate: gates",
)
def test_mixed_precision_training_gate_catches_a_reduction_in_bf16_under_an_fp32_policy(gate_runner: Any) -> None:
    planted = NarrowReduceTransformer(
        "planted bf16 reduce under a float32-reduce policy", steps=1, precision=PRECISIONS["bf16-params-fp32-reduce"],
        world_size=min(gate_config().nproc, 4),
    )  # fmt: skip
    _caught(gate_runner, "negative:training:precision:NarrowReduceTransformer", planted)


# -- pipeline parallelism: torch.distributed.pipelining (harness/tasks/pipeline.py) ---------
#: four blocks in two stages: the first holds the embedding, the last the norm and the head,
#: so each stage's parameter groups differ
PIPELINED = TransformerCase("dense MLP, 4 layers in 2 pipeline stages", layers=4, steps=3)


def _pipelined(case: TransformerCase) -> TransformerCase:
    """On 2 ranks (a stage each) or 4 (each stage FSDP2 over 2), where the session has them."""
    return _on(case, 4 if gate_config().nproc >= 4 else 2)


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_pipelined_training_matches_single_process_reference_at_every_step(gate_runner: Any, schedule: str) -> None:
    """Each schedule over two pipeline ranks, three micro-batches a step (a divisor that no power
    of two hides): GPipe and 1F1B with a stage a rank, the interleaved ones and looped BFS with
    two model chunks a rank; each chunk laid out by FSDP2 over the ranks it has. Losses,
    gradients, parameters and state of every chunk against one process that sums each rank's
    micro-batches (in the order the schedule's backwards take them), averages the ranks and
    divides by three. Bitwise on 2 and 4 ranks."""
    gate_runner.reference_only("training:pipeline")
    gate_runner.check("training:pipeline", PipelineCase(_pipelined(PIPELINED), schedule), task="pipeline")


@pytest.mark.judges(
    "the pipeline training gate, with a schedule that sums its micro-batches' gradients where their mean is "
    "due, and one that trains on the last micro-batch alone (negative controls)",
    "muongate: gates",
)
@pytest.mark.parametrize(
    ("planted", "schedule"),
    # a schedule of one micro-batch a step (the last-alone plant's) is GPipe's: 1F1B wants one a stage
    [(SummedPipeline, "1f1b"), (LastMicroBatchPipeline, "gpipe")],
    ids=["SummedPipeline", "LastMicroBatchPipeline"],
)
def test_pipelined_training_gate_catches_a_wrong_mean_over_micro_batches(
    gate_runner: Any, planted: type, schedule: str
) -> None:
    case = planted(_pipelined(replace(PIPELINED, name=f"planted {planted.__name__}", steps=1)), schedule)
    _caught(gate_runner, f"negative:training:pipeline:{planted.__name__}", case, task="pipeline")


# -- a resume across a learning-rate schedule (harness/models/step.py, Resume) --
RESUMED = Resume("warmup_decay", after=2, adamw_schedule="linear_decay", no_decay=("norm", "embed", "router"))


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_training_resumed_across_a_schedule_matches_single_process_reference(gate_runner: Any, name: Mlp) -> None:
    """The sharded side saves its model and optimizer with DCP and its schedule's state after two
    of four steps, loads them into a fresh model of other values laid out again, a fresh
    optimizer and schedule, and trains on; one process trains straight through. Muon's groups
    warm up and decay, AdamW's decay linearly, and the norms, the embedding and the router
    take no weight decay (groups of their own). Bitwise on 2 ranks, every step: the parameters
    and states, each group's learning rate and decay, each parameter's step count; a resume
    that loses a moment, the schedule's position, a mask or a parameter differs."""
    gate_runner.reference_only("training:resume")
    case = TransformerCase(f"{name} MLP, per-group schedules and masks, resumed", mlp=name, steps=4, resume=RESUMED)
    gate_runner.train("training:resume", _on(case, min(gate_config().nproc, 4)))


@pytest.mark.judges(
    "the resume training gate, with a resume that restarts the schedule (negative control)", "muongate: gates"
)
def test_resumed_training_gate_catches_a_schedule_restarted(gate_runner: Any) -> None:
    planted = RestartedScheduleTransformer("planted schedule restarted on resume", steps=4, resume=RESUMED)
    _caught(gate_runner, "negative:training:resume:RestartedScheduleTransformer", planted)


@pytest.mark.judges(
    "the resume training gate, with a resume that drops AdamW's first moments (negative control)", "muongate: gates"
)
def test_resumed_training_gate_catches_a_moment_dropped(gate_runner: Any) -> None:
    planted = DroppedMomentTransformer("planted first moments dropped on resume", steps=4, resume=RESUMED)
    _caught(gate_runner, "negative:training:resume:DroppedMomentTransformer", planted)


@pytest.mark.judges(
    "the resume training gate, with a resume that decays the parameters the mask exempts (negative control)",
    "muongate: gates",
)
def test_resumed_training_gate_catches_decay_applied_to_a_masked_parameter(gate_runner: Any) -> None:
    planted = DecayedOnResumeTransformer("planted decay mask forgotten on resume", steps=4, resume=RESUMED)
    _caught(gate_runner, "negative:training:resume:DecayedOnResumeTransformer", planted)


def test_training_resumed_on_fewer_ranks_matches_single_process_reference(gate_runner: Any) -> None:
    """The sharded side saves after two of four steps on all its ranks and resumes on half of
    them (an elastic restart on fewer hosts: a mesh of its own, DCP resharding the checkpoint);
    one process trains straight through and, from the resume on, on the remaining ranks' data
    alone. Bitwise at 2 ranks (resumed on 1), in the reduction-order tier at 4 (on 2)."""
    gate_runner.reference_only("training:resume")
    world = min(gate_config().nproc, 4)
    case = TransformerCase(
        f"dense MLP, resumed on {world // 2} of {world} ranks", steps=4,
        resume=replace(RESUMED, world=world // 2), world_size=world,
    )  # fmt: skip
    gate_runner.train("training:resume", case)


@pytest.mark.judges(
    "the resume training gate on fewer ranks, with a resume that keeps the old world's divisor (negative control)",
    "muongate: gates",
)
def test_resumed_training_gate_catches_the_old_worlds_divisor_after_a_resume_on_fewer_ranks(gate_runner: Any) -> None:
    planted = OldDivisorOnResumeTransformer(
        "planted old divisor on fewer ranks", steps=4, resume=replace(RESUMED, world=1), world_size=2
    )
    _caught(gate_runner, "negative:training:resume:OldDivisorOnResumeTransformer", planted)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_training_twins_agree_bitwise_at_every_world_size(gate_runner: Any, world: int) -> None:
    """The same FSDP2 model twice, one twin stepped by the candidate, the other by
    ``reference.Muon`` on the gathered parameters and gradients (``run_training_twins``),
    two micro-batches accumulated per step: bitwise at any world size, where the
    single-process comparison above needs a tolerance tier beyond 2 ranks."""
    gate_runner.reference_only("training:twins")
    if world > gate_config().nproc:
        pytest.skip(f"needs --nproc {world}")
    gate_runner.check("training:twins", TwinsCase(_on(CASES["dense"], world), accumulate=2), task="twins")


def test_training_twins_agree_bitwise_under_fsdp2_over_tensor_parallel(gate_runner: Any) -> None:
    """The twins on a ``(dp, tp)`` mesh of ``(2, 2)``: Q, K, V and the MLP's first matrix
    ``ColwiseParallel``, the attention output and the second matrix ``RowwiseParallel``,
    then FSDP2 on ``dp`` (``_StridedShard`` and ``(Shard(0), Shard(1))`` weights)."""
    gate = f"training:twins:{FSDP_TP}"
    gate_runner.reference_only(gate)
    if gate_config().nproc < 4:
        pytest.skip("needs --nproc 4")
    gate_runner.require(gate, {FSDP_TP.name}, "its claim is FSDP2 × TP training")
    case = TwinsCase(_on(CASES["dense"], 4), accumulate=2, tp=2)
    gate_runner.check(gate, case, task="twins")


@pytest.mark.judges(
    "the training-twins gate, with a planted off-by-one shard boundary (negative control)", "muongate: gates"
)
def test_training_twins_catch_off_by_one_shard_boundary(gate_runner: Any) -> None:
    planted = TwinsCase(TransformerCase("planted off-by-one rows, twins", steps=2, candidate=OffByOneRowsMuon))
    _caught(gate_runner, "negative:training:twins:OffByOneRowsMuon", planted, task="twins")


@pytest.mark.judges("the training-twins gate, with a planted AdamW bug (negative control)", "muongate: gates")
def test_training_twins_catch_an_adamw_that_decays_through_the_gradient(gate_runner: Any) -> None:
    """The twins under another reference: ``reference.AdamW`` against a planted AdamW that adds
    its weight decay to the gradient (``L2DecayAdamW``), on the same FSDP2 transformer."""
    spec = TransformerCase(
        "planted L2 decay, twins", steps=2, candidate=L2DecayAdamW, reference=reference.AdamW, settings=()
    )
    _caught(gate_runner, "negative:training:twins:L2DecayAdamW", TwinsCase(spec), task="twins")


# -- a team's own model (``--model MODULE:FACTORY``, harness/models/plugin.py) --------------
def _model(gate_model: Any, gate: str, world: int) -> Any:
    if gate_model is None:
        pytest.skip(f"{gate}: trains the --model factory's model; none was given")
    if world > gate_config().nproc:
        pytest.skip(f"{gate}: needs --nproc {world}")
    return gate_model.on(world)


def test_the_models_training_matches_single_process_reference(gate_runner: Any, gate_model: Any) -> None:
    """The same claim as for muongate's transformer, on the ``--model`` model: bitwise on 2
    ranks, the ``reduction_order`` tier beyond."""
    gate_runner.reference_only("training:model")
    gate_runner.train("training:model", _model(gate_model, "training:model", min(gate_config().nproc, 4)))


@pytest.mark.parametrize("world", [2, 4, 8])
def test_the_models_training_twins_agree_bitwise(gate_runner: Any, gate_model: Any, world: int) -> None:
    gate_runner.reference_only("training:model:twins")
    case = _model(gate_model, "training:model:twins", world)
    gate_runner.check("training:model:twins", TwinsCase(case, accumulate=2), task="twins")


def test_the_models_training_twins_agree_bitwise_under_fsdp2_over_tensor_parallel(
    gate_runner: Any, gate_model: Any
) -> None:
    gate = f"training:model:twins:{FSDP_TP}"
    gate_runner.reference_only(gate)
    case = _model(gate_model, gate, 4)
    if not case.tp_styles:
        pytest.skip(f"{gate}: {case.spec} declares no muongate_tp_plan")
    gate_runner.require(gate, {FSDP_TP.name}, "its claim is FSDP2 × TP training")
    gate_runner.check(gate, TwinsCase(case, accumulate=2, tp=2), task="twins")
