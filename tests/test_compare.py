"""Claims about ``harness.verdicts.compare``: bitwise means the same bits, figures are right, and
a comparison of nothing is flagged."""

from __future__ import annotations

import math

import torch

from harness.verdicts.compare import Tier, compare, ordered_bits


def test_negative_zero_is_not_bitwise_positive_zero():
    c = compare(torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0]), tensor="t")
    assert not c.bitwise and not c.passed and c.mismatches == 1 and c.worst_index == (0,)
    assert c.max_abs_diff == 0.0 and c.max_ulp == 0.0, "the sign of zero is a bit flip, not a distance"


def test_nan_payloads_are_told_apart_and_equal_nans_are_bitwise():
    quiet = torch.tensor([float("nan")])
    other = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    assert compare(quiet, quiet.clone(), tensor="t").bitwise
    c = compare(quiet, other, tensor="t")
    assert not c.bitwise and c.max_ulp == float("inf")


def test_a_nan_against_a_number_is_reported_as_nan_not_inf() -> None:
    """inf is a difference a number can have (``inf`` against ``1.0``); a NaN's is NaN, and the
    comparison fails in every tier, however wide."""
    expected, actual = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, float("nan"), 3.5])
    c = compare(expected, actual, tensor="t")
    assert math.isnan(c.max_abs_diff) and not c.passed and c.mismatches == 2 and c.worst_index == (1,)
    assert "max|diff| nan" in c.line()
    wide = Tier("wide", "tolerance", "any difference", max_ulp=2**62, atol=math.inf, max_rel_fro=math.inf)
    assert not compare(expected, actual, tensor="t", tier=wide).passed
    # an infinity against a number is still one
    assert compare(torch.tensor([1.0]), torch.tensor([math.inf]), tensor="t").max_abs_diff == math.inf


def test_ulp_distance_counts_representable_steps_across_zero():
    a = torch.tensor([1.0, -1.0, 0.0], dtype=torch.float32)
    b = torch.nextafter(a, torch.tensor(float("inf")))
    assert (ordered_bits(b) - ordered_bits(a)).tolist() == [1, 1, 1]
    assert int(ordered_bits(torch.tensor([1e-45])) - ordered_bits(torch.tensor([-1e-45]))) == 2


def test_figures_name_the_worst_element_and_both_values():
    e = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    a = e.clone()
    a[1, 0] = 3.5
    a[0, 1] = torch.nextafter(torch.tensor(2.0), torch.tensor(3.0))
    c = compare(e, a, tensor="t", step=2, rank=1)
    assert (c.mismatches, c.worst_index, c.expected_at_worst, c.actual_at_worst) == (2, (1, 0), 3.0, 3.5)
    assert c.max_abs_diff == 0.5 and c.mismatch_fraction == 0.5 and (c.step, c.rank) == (2, 1)


def test_bf16_tensors_compare_on_their_own_bits():
    e = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    a = torch.tensor([1.0, 2.015625], dtype=torch.bfloat16)
    c = compare(e, a, tensor="t")
    assert c.max_ulp == 1 and c.dtype == "bfloat16"


def test_all_zero_comparison_is_flagged():
    c = compare(torch.zeros(3), torch.zeros(3), tensor="t")
    assert c.bitwise and c.all_zero and "compares nothing" in c.note


def test_tolerance_tier_passes_within_its_bound_and_never_reports_bitwise():
    tier = Tier("ns-kernel", "tolerance", "a different kernel reorders sums", max_ulp=2)
    e = torch.tensor([1.0])
    close = torch.nextafter(e, torch.tensor([2.0]))
    c = compare(e, close, tensor="t", tier=tier)
    assert c.passed and not c.bitwise and c.tier == "ns-kernel"
    assert not compare(e, e + 1e-3, tensor="t", tier=tier).passed


def test_shape_mismatch_is_a_failed_comparison_naming_both_shapes():
    c = compare(torch.zeros(2), torch.zeros(3), tensor="t")
    assert not c.passed and not c.bitwise and "shape [3], the reference's [2]" in c.note
    # Its line says why it could not compare, and no figure it did not measure ("0/3 differ").
    assert c.line() == "t step 0 rank 0 [bitwise]: " + c.note


def test_dtype_mismatch_is_compared_after_a_stated_cast_and_never_bitwise():
    expected = torch.tensor([1.0, 1.0 + 2.0**-12])
    c = compare(expected, expected.bfloat16(), tensor="t")
    assert not c.passed and not c.bitwise
    assert "dtype bfloat16, the reference's float32: compared after casting to float32" in c.note
    assert c.mismatches == 1 and c.worst_index == (1,) and c.max_abs_diff == 2.0**-12
    same_values = compare(torch.ones(2), torch.ones(2, dtype=torch.bfloat16), tensor="t")
    assert not same_values.passed and same_values.mismatches == 0


def test_a_failed_comparison_of_zeros_of_other_signs_says_the_sign_bits_differ_not_that_it_compares_nothing() -> None:
    c = compare(torch.full((8,), -0.0), torch.zeros(8), tensor="exp_avg")
    assert not c.passed and c.all_zero and c.mismatches == 8
    assert c.note == "zero in value, sign bits differ: -0.0 against +0.0 at 8 elements"
    assert "compares nothing" not in c.note


def test_signed_zeros_among_other_differences_are_counted_each_way() -> None:
    both = compare(torch.tensor([0.0, -0.0, 0.0]), torch.tensor([-0.0, 0.0, 0.0]), tensor="t")
    assert (
        both.note == "zero in value, sign bits differ: -0.0 against +0.0 at 1 element, +0.0 against -0.0 at 1 element"
    )
    mixed = compare(torch.tensor([0.0, 1.0, 2.0]), torch.tensor([-0.0, 1.0, 3.0]), tensor="t")
    assert mixed.note == "1 of 2 differing elements zero in value, sign bits differ: +0.0 against -0.0 at 1 element"


def test_equal_zeros_still_compare_nothing() -> None:
    assert compare(torch.zeros(3), torch.zeros(3), tensor="t").note == "both all zero: compares nothing"
    recast = compare(torch.zeros(3), torch.zeros(3, dtype=torch.float64), tensor="t")
    assert not recast.passed and recast.note.endswith("both all zero: compares nothing")
