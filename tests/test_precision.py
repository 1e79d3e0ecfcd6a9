"""Claims about ``harness.models.precision``: the one-device side follows a declared mixed
precision as FSDP2 applies it, and a declaration FSDP2 could not mean is refused by name."""

from __future__ import annotations

import pytest
import torch

from harness.models.precision import FULL, Precision
from harness.models.transformer import TransformerCase
from harness.tasks.training import reduction_order, reduction_order_loss


def _bf16(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.bfloat16)


def test_a_bf16_reduce_rounds_the_sum_that_a_float32_reduce_keeps():
    param = torch.zeros(1)
    grads = [[_bf16(1.0)], [_bf16(2**-8)]]  # 1 + 2^-8 needs 9 significant bits: bf16 keeps 8
    assert Precision("bfloat16", "float32").mean(grads, [param])[0].item() == (1 + 2**-8) / 2
    assert Precision("bfloat16").mean(grads, [param])[0].item() == 0.5


def test_the_mean_keeps_a_negative_zero_that_every_rank_gives():
    mean = FULL.mean([[torch.tensor([-0.0])], [torch.tensor([-0.0])]], [torch.zeros(1)])[0]
    assert torch.signbit(mean).item(), "0.0 + -0.0 is +0.0: the sum must start from the first rank's gradient"


def test_a_parameter_no_rank_reaches_gets_a_zero_mean_in_its_own_dtype():
    mean = Precision("bfloat16", "float32").mean([[None], [None]], [torch.ones(2, 3)])[0]
    assert mean.dtype == torch.float32 and mean.shape == (2, 3) and not mean.any()


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
    ("fields", "named"),
    [({"param": "float16"}, "param='float16'"), ({"reduce": "float32"}, "reduce='float32' without param")],
)
def test_a_declaration_fsdp2_could_not_mean_is_refused_naming_the_field(fields, named):
    with pytest.raises(ValueError, match=named):
        Precision(**fields)


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
