"""Claims about ``harness.models.step``: the one-device side follows a declared mixed precision,
accumulation and HSDP mesh as FSDP2 reduces them, and a declaration FSDP2 could not mean is
refused by name."""

from __future__ import annotations

import os

import pytest
import torch
from support import REPO, run_python

from harness.models.step import FULL, SCHEDULES, Accumulation, Precision, Resume, one_device_gradients
from harness.models.transformer import TransformerCase
from harness.tasks.pipeline import PipelineCase
from harness.tasks.training import order_free, reduction_order, reduction_order_loss


def _bf16(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.bfloat16)


def _mean(grads, param, **declared):
    """``one_device_gradients`` of one parameter, ``grads[rank][micro]``."""
    spec = TransformerCase("x", world_size=len(grads), **declared)
    return one_device_gradients([[[g] for g in rank] for rank in grads], [param], spec)[0]


def test_a_bf16_reduce_rounds_the_sum_that_a_float32_reduce_keeps():
    param = torch.zeros(1)
    grads = [[_bf16(1.0)], [_bf16(2**-8)]]  # 1 + 2^-8 needs 9 significant bits: bf16 keeps 8
    assert _mean(grads, param, precision=Precision("bfloat16", "float32")).item() == (1 + 2**-8) / 2
    assert _mean(grads, param, precision=Precision("bfloat16")).item() == 0.5


def test_the_mean_keeps_a_negative_zero_that_every_rank_gives():
    mean = _mean([[torch.tensor([-0.0])], [torch.tensor([-0.0])]], torch.zeros(1))
    assert torch.signbit(mean).item(), "0.0 + -0.0 is +0.0: the sum must start from the first rank's gradient"


def test_a_parameter_no_rank_reaches_gets_a_zero_mean_in_its_own_dtype():
    mean = _mean([[None], [None]], torch.ones(2, 3), precision=Precision("bfloat16", "float32"))
    assert mean.dtype == torch.float32 and mean.shape == (2, 3) and not mean.any()


def test_reducing_every_micro_batch_and_reducing_their_sum_round_differently_as_fsdp2_does():
    # rank 0's micro-batches give 1 and 1, rank 1's 2^-24 and 2^-23 (float32 keeps 24 bits)
    grads = [[torch.tensor([1.0]), torch.tensor([1.0])], [torch.tensor([2**-24]), torch.tensor([2**-23])]]
    param = torch.zeros(1)
    every = _mean(grads, param, accumulation=Accumulation(2, "every")).item()
    last = _mean(grads, param, accumulation=Accumulation(2, "last")).item()
    assert every == 1.0  # 0.5 + (0.5 + 2^-24): the last 2^-24 is half an ulp of 1, rounded to even
    assert last == 1 + 2**-23  # (2 + 3·2^-24) / 2: 3·2^-24 is three quarters of an ulp of 2, rounded up


def test_hsdp_means_within_each_replica_then_across_replicas():
    param = torch.zeros(1)
    grads = [[torch.tensor([v])] for v in (1.0, 1.0, 2**-24, 2**-23)]  # replica 0: ranks 0, 1
    # (1 + 1.5·2^-24) rounds up to 1 + 2^-23, halved; in rank order, 2 + 2^-24 + 2^-23 rounds to 2
    assert _mean(grads, param, replicate=2).item() == 0.5 + 2**-24
    assert _mean(grads, param).item() == 0.5


def test_the_one_device_forward_runs_on_a_cast_copy_and_leaves_the_masters_alone():
    model = torch.nn.Linear(3, 2)
    computed = Precision("bfloat16", "float32").computed_on(model)
    assert computed is not model and computed.weight.dtype == torch.bfloat16
    assert model.weight.dtype == torch.float32
    assert FULL.computed_on(model) is model


def test_autocast_wraps_the_forward_only_where_declared():
    x = torch.randn(2, 3)
    w = torch.randn(3, 3)
    with Precision(autocast="bfloat16").forward(torch.device("cpu")):
        assert (x @ w).dtype == torch.bfloat16
    with FULL.forward(torch.device("cpu")):
        assert (x @ w).dtype == torch.float32


@pytest.mark.parametrize(
    ("declare", "named"),
    [
        (lambda: Precision(param="float16"), "param='float16'"),
        (lambda: Precision(reduce="float32"), "reduce='float32' without param"),
        (lambda: Accumulation(0), "micro_batches=0"),
        (lambda: Accumulation(2, "never"), "sync='never'"),
        (lambda: TransformerCase("x", world_size=4, replicate=3), "replicate=3"),
        (lambda: TransformerCase("x", accumulation=Accumulation(2, "last_all_reduce")), "only under HSDP"),
        (lambda: Resume("cosine"), "schedule='cosine'"),
        (lambda: Resume(after=-1), "after=-1"),
        (lambda: Resume(adamw_schedule="cosine"), "adamw_schedule='cosine'"),
        (lambda: Resume(no_decay="norm"), "no_decay='norm'"),
        (lambda: Resume(world=1), "world=1: the ranks a resume continues on, with after > 0"),
        (lambda: TransformerCase("x", resume=Resume(after=1, world=2)), "resume world=2 with world_size=2"),
        (lambda: TransformerCase("x", steps=2, resume=Resume(after=2)), "resume after=2 with steps=2"),
        (lambda: PipelineCase(TransformerCase("x", layers=4), "zero_bubble"), "schedule='zero_bubble'"),
        (lambda: PipelineCase(TransformerCase("x", layers=3)), "stages=2: at least 2, dividing"),
        (lambda: PipelineCase(TransformerCase("x", layers=4), micro_batches=1), "micro_batches=1"),
        (
            lambda: PipelineCase(TransformerCase("x", layers=4, accumulation=Accumulation(2))),
            "the spec's accumulation=Accumulation",
        ),
        (
            lambda: PipelineCase(TransformerCase("x", layers=4, precision=Precision(autocast="bfloat16"))),
            "the spec's precision=Precision",
        ),
    ],
)
def test_a_declaration_fsdp2_could_not_mean_is_refused_naming_the_field(declare, named):
    with pytest.raises(ValueError, match=named):
        declare()


@pytest.mark.parametrize(
    ("world", "replicate", "bitwise"), [(2, 1, True), (4, 1, False), (4, 2, True), (8, 2, False), (8, 4, False)]
)
def test_the_step_is_held_bitwise_where_every_mean_is_of_at_most_two_ranks(world, replicate, bitwise):
    assert order_free(TransformerCase("x", world_size=world, replicate=replicate)) is bitwise


def test_the_policy_is_fsdp2s_own():
    from torch.distributed.fsdp import MixedPrecisionPolicy

    assert Precision("bfloat16", "float32").policy() == MixedPrecisionPolicy(torch.bfloat16, torch.float32)
    assert FULL.policy() == MixedPrecisionPolicy()


@pytest.mark.parametrize(
    ("precision", "tier", "bound"),
    [
        (FULL, "reduction_order", 0.15),
        (Precision(autocast="bfloat16"), "reduction_order", 0.15),
        (Precision("bfloat16", "float32"), "reduction_order_bf16_grads_fp32_reduce", 1e-6),
        (Precision("bfloat16"), "reduction_order_bf16", 0.15),
    ],
)
def test_each_declared_precision_is_judged_in_its_own_measured_tier_beyond_two_ranks(precision, tier, bound):
    spec = TransformerCase("x", world_size=4, precision=precision)
    assert (reduction_order(spec).name, reduction_order(spec).max_rel_fro) == (tier, bound)
    assert reduction_order_loss(spec).name.startswith(tier)


def test_a_case_says_its_precision_where_it_is_mixed():
    assert (
        "bfloat16 params, float32 reduce" in TransformerCase("x", precision=Precision("bfloat16", "float32")).describe()
    )
    assert "params" not in TransformerCase("x").describe()


def _bf16_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(4, 4)]))


_bf16_model.muongate_precision = {"param": "bfloat16", "reduce": "float32"}  # type: ignore[attr-defined]


def _fp16_model() -> torch.nn.Module:
    return _bf16_model()


_fp16_model.muongate_precision = {"param": "float16"}  # type: ignore[attr-defined]


def test_a_model_factory_declares_its_precision_and_a_wrong_one_is_refused_naming_the_spec():
    from harness.models.plugin import ModelCase

    assert ModelCase.load(f"{__name__}:_bf16_model").precision == Precision("bfloat16", "float32")
    with pytest.raises(
        ValueError, match=rf"--model {__name__}:_fp16_model: muongate_precision: Precision param='float16'"
    ):
        ModelCase.load(f"{__name__}:_fp16_model")


def test_the_warm_up_and_decay_schedule_changes_the_rate_at_every_step_a_restart_would_repeat():
    """A schedule restarted on resume is caught only where the rates after the resume differ
    from those of its first steps: they do at every step of the four the resume gate trains."""
    rates = [SCHEDULES["warmup_decay"](step) for step in range(4)]
    assert rates == [0.5, 1.0, 0.5, 0.25]
    assert rates[1] != rates[3], "a restart after step 2 steps its last step at the second step's rate"


def test_a_case_says_its_schedule_and_when_it_resumes():
    case = TransformerCase("x", steps=4, resume=Resume("warmup_decay", after=2))
    assert case.describe().endswith(", warmup_decay schedule, resumed after step 2)")
    assert "schedule" not in TransformerCase("x").describe()


def test_a_decay_mask_moves_the_parameters_it_names_into_groups_that_decay_nothing():
    import torch

    a, b, c = (torch.zeros(2, 2) for _ in range(3))
    groups = [
        {"params": [a, b], "param_names": ["blocks.0.q", "blocks.0.router"], "use_muon": True},
        {"params": [c], "param_names": ["norm.weight"], "use_muon": False},
    ]
    masked = Resume(no_decay=("norm", "router")).masked(groups)
    assert [(g["param_names"], g.get("weight_decay"), g.get("adamw_weight_decay")) for g in masked] == [
        (["blocks.0.q"], None, None),
        (["blocks.0.router"], 0.0, 0.0),
        (["norm.weight"], 0.0, 0.0),
    ]
    assert [g["use_muon"] for g in masked] == [True, True, False] and masked[1]["params"][0] is b
    assert Resume().masked(groups) is groups


def test_each_group_follows_its_own_schedule():
    import torch

    params = [torch.nn.Parameter(torch.zeros(2, 2)), torch.nn.Parameter(torch.zeros(2))]
    opt = torch.optim.SGD(
        [{"params": [params[0]], "use_muon": True}, {"params": [params[1]], "use_muon": False}], lr=1.0
    )
    schedule = Resume("warmup_decay", adamw_schedule="linear_decay").on(opt)
    assert schedule is not None
    for step in range(3):
        assert [g["lr"] for g in opt.param_groups] == [SCHEDULES["warmup_decay"](step), SCHEDULES["linear_decay"](step)]
        opt.step()
        schedule.step()


def test_a_pipeline_s_one_device_step_sums_each_data_rank_s_micro_batches_before_their_mean():
    """Under FSDP2 a stage reduces at its last micro-batch only, so one device sums each rank's
    micro-batches first; on 4 ranks in 2 stages each mean is of 2 ranks, so the step is bitwise."""
    case = PipelineCase(TransformerCase("x", layers=4, world_size=4), micro_batches=3)
    one = case.one_device()
    assert (one.world_size, one.accumulation) == (2, Accumulation(3, "last"))
    assert order_free(one)
    assert not order_free(PipelineCase(TransformerCase("x", layers=4, world_size=8)).one_device())


@pytest.mark.slow
def test_the_zero_bubble_fsdp2_finding_still_reproduces_with_torch_alone() -> None:
    """The torch finding that keeps ``ScheduleInterleavedZeroBubble`` out of the pipeline gates'
    schedules; when torch fixes it, this fails, and the schedule can join them."""
    from harness.tasks.pipeline import SCHEDULES

    assert all(s.cls != "ScheduleInterleavedZeroBubble" for s in SCHEDULES.values())
    script = REPO / "examples" / "findings" / "pipelining_zero_bubble_fsdp2_blocks.py"
    run = run_python(
        "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", script,
        timeout=120, env={**os.environ, "PYTHONPATH": ""},
    )  # fmt: skip
    assert run.returncode != 0, run.stdout[-2000:]
    assert "ScheduleInterleaved1F1B, fully_shard on each block and the stage: every gradient agrees" in run.stdout
    assert "ScheduleInterleavedZeroBubble, fully_shard on the stage: every gradient agrees" in run.stdout
    assert "ScheduleInterleavedZeroBubble, fully_shard on each block and the stage: stage" in run.stdout
