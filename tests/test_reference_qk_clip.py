"""Claims about QK-clip on one device (``reference/qk_clip.py``): a head whose largest logit
exceeds the threshold has its logits scaled by ``tau / S``, split between the query and the key
by ``alpha``; every other head is left as it was, bit for bit."""

from __future__ import annotations

import pytest
import torch

from harness.verdicts.compare import compare
from reference.qk_clip import clip_factors, head_of_rows, qk_clip_


@pytest.mark.parametrize("alpha", [0.5, 0.0, 1.0, 0.25])
def test_a_clipped_head_s_logits_shrink_by_tau_over_its_largest_and_the_others_are_untouched(alpha: float) -> None:
    gen = torch.Generator().manual_seed(0)
    heads, width, cols = 3, 4, 5
    w_q, w_k = torch.randn(heads * width, cols, generator=gen), torch.randn(heads * width, cols, generator=gen)
    q0, k0 = w_q.clone(), w_k.clone()
    largest = torch.tensor([0.5, 2.0, 8.0])
    qk_clip_(w_q, w_k, largest, tau=1.0, alpha=alpha)
    rows = slice(0, width)
    assert compare(q0[rows], w_q[rows], tensor="q").bitwise and compare(k0[rows], w_k[rows], tensor="k").bitwise
    for h, s in ((1, 2.0), (2, 8.0)):
        rows = slice(h * width, (h + 1) * width)
        logits_before, logits_after = q0[rows] @ k0[rows].T, w_q[rows] @ w_k[rows].T
        torch.testing.assert_close(logits_after, logits_before * (1.0 / s))
        torch.testing.assert_close(w_q[rows], q0[rows] * (1.0 / s) ** alpha)


def test_a_head_at_the_threshold_is_not_clipped_and_bad_settings_are_refused() -> None:
    q_factor, k_factor = clip_factors(torch.tensor([1.0, 1.0000001]), tau=1.0)
    assert q_factor[0].item() == 1.0 and k_factor[0].item() == 1.0 and q_factor[1].item() < 1.0
    with pytest.raises(ValueError, match="tau=0"):
        clip_factors(torch.ones(2), tau=0)
    with pytest.raises(ValueError, match="alpha=2"):
        clip_factors(torch.ones(2), tau=1.0, alpha=2)
    with pytest.raises(ValueError, match="heads=3"):
        head_of_rows(8, 3)


def test_a_bf16_projection_is_scaled_in_float32_and_rounded_once() -> None:
    w_q = torch.randn(4, 3).bfloat16()
    w_k = w_q.clone()
    expected = (w_q.float() * (0.5**0.5)).bfloat16()
    qk_clip_(w_q, w_k, torch.tensor([2.0, 2.0]), tau=1.0)
    assert compare(expected, w_q, tensor="q").bitwise
