"""Claims about the clipping reference (``reference/clipping.py``): the float64 norm of every
distinct gradient once, and torch's coefficient and kernel, so that a correct clip's scaled
gradients are the reference's bits."""

from __future__ import annotations

import math

import pytest
import torch

from harness.verdicts.compare import compare
from reference.clipping import clip_coefficient, clip_gradients, grad_norm


def test_grad_norm_counts_each_distinct_tensor_once_and_skips_missing_gradients() -> None:
    a, b = torch.tensor([3.0, 0.0]), torch.tensor([[4.0]])
    assert grad_norm([a, b, a, None]).item() == 5.0
    assert grad_norm([a, b.clone()]).item() == 5.0
    assert grad_norm([a, a.clone()]).item() == math.sqrt(18)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
def test_grad_norm_is_the_float64_norm_of_all_elements_as_one_vector(norm_type: float) -> None:
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(5, 7, generator=gen), torch.randn(3, generator=gen).bfloat16(), torch.empty(0, 4)]
    flat = torch.cat([g.double().flatten() for g in grads])
    norm = grad_norm(grads, norm_type)
    assert norm.dtype == torch.float64 and norm.dim() == 0
    assert math.isclose(norm.item(), torch.linalg.vector_norm(flat, norm_type).item(), rel_tol=1e-15)


def test_no_gradient_at_all_is_a_norm_of_zero_and_a_bad_norm_type_is_refused() -> None:
    assert grad_norm([None, torch.empty(0)]).item() == 0.0
    assert grad_norm([], math.inf).item() == 0.0
    with pytest.raises(ValueError, match="norm_type=0"):
        grad_norm([torch.ones(2)], 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("max_norm", [0.5, 1e4])
def test_scaling_by_the_coefficient_of_torchs_norm_gives_torchs_clipped_bits(
    dtype: torch.dtype, max_norm: float
) -> None:
    gen = torch.Generator().manual_seed(1)
    params = [torch.nn.Parameter(torch.zeros(s, dtype=dtype)) for s in ((6, 5), (9,))]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen).to(dtype)
    grads = [p.grad.clone() for p in params]  # type: ignore[union-attr]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    clip_gradients(grads, clip_coefficient(norm, max_norm))
    for p, g in zip(params, grads, strict=True):
        assert compare(g, p.grad, tensor="grad").bitwise  # type: ignore[arg-type]


def test_the_coefficient_never_scales_up_and_keeps_the_norms_dtype() -> None:
    assert clip_coefficient(torch.tensor(0.5), 1.0).item() == 1.0
    small = clip_coefficient(torch.tensor(4.0, dtype=torch.bfloat16), 1.0)
    assert small.dtype == torch.bfloat16 and small.item() == pytest.approx(0.25, rel=1e-2)


def test_deepspeed_s_divided_form_is_one_over_the_clip_ratio_and_an_unknown_form_is_refused() -> None:
    norm = torch.tensor(3.0)
    ratio = torch.clamp((norm + 1e-6) / 0.5, min=1.0)
    assert compare(1.0 / ratio, clip_coefficient(norm, 0.5, "divide"), tensor="c").bitwise
    assert clip_coefficient(torch.tensor(0.1), 0.5, "divide").item() == 1.0
    with pytest.raises(ValueError, match="form='multiply'"):
        clip_coefficient(norm, 0.5, "multiply")


def test_the_fp32_norm_tier_widens_with_the_largest_tensor_and_keeps_its_name() -> None:
    from harness.verdicts.compare import CLIP_NORM, clip_norm_tier

    assert clip_norm_tier("float32", 48 * 48) is CLIP_NORM["float32"]
    wide = clip_norm_tier("float32", 2_049_024)
    assert wide.name == "clip_norm_fp32" and 1e-4 < wide.rtol < 1e-3 and "2,049,024 elements" in wide.reason
    assert clip_norm_tier("bfloat16", 2_049_024) is CLIP_NORM["bfloat16"]
    assert clip_norm_tier("float32", 20_000_000).rtol > 3 * 1.5e-3  # 3 times the worst measured there
