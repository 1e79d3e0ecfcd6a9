"""Claims about ``reference.LowBitAdamW``: below its size threshold it is ``reference.AdamW`` with
float32 moments, bit for bit; above it, each stored moment is a code times its block's scale,
at most ``levels`` codes either side of zero, and its blocks are the whole tensor's (a piece of
the result needs its blocks' scales, not its own); bad settings are refused by name.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.verdicts.compare import compare
from reference import AdamW, LowBitAdamW, quantized

SHAPES = st.sampled_from([(1,), (7,), (4, 4), (33, 7), (2, 3, 5)])


def _run(opt_class: type[torch.optim.Optimizer], shape: tuple[int, ...], seed: int, **kw: object) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    p = torch.randn(shape, generator=gen).requires_grad_()
    opt = opt_class([p], **kw)
    for _ in range(3):
        p.grad = torch.randn(shape, generator=gen)
        opt.step()
    return p.detach(), opt.state[p]


@given(shape=SHAPES, seed=st.integers(0, 2**16), amsgrad=st.booleans())
@settings(max_examples=50, deadline=None)
def test_below_its_threshold_it_is_reference_adamw_with_float32_moments_bitwise(shape, seed, amsgrad) -> None:
    ours = _run(LowBitAdamW, shape, seed, amsgrad=amsgrad, min_quantized_numel=10**9)
    plain = _run(AdamW, shape, seed, amsgrad=amsgrad, state_dtype="float32")
    assert compare(plain[0], ours[0], tensor="param").passed
    for key, value in plain[1].items():
        assert compare(value, ours[1][key], tensor=key).passed, key


@given(shape=SHAPES, seed=st.integers(0, 2**16), block=st.sampled_from([1, 2, 3, 5, 256]))
@settings(max_examples=50, deadline=None)
def test_stored_moments_are_whole_codes_of_their_blocks_largest_magnitude(shape, seed, block) -> None:
    _, state = _run(LowBitAdamW, shape, seed, block_size=block, min_quantized_numel=0)
    for key, levels in (("exp_avg", 127), ("exp_avg_sq", 255)):
        flat = state[key].reshape(-1)
        for start in range(0, flat.numel(), block):
            values = flat[start : start + block]
            scale = values.abs().max()
            if scale == 0:
                continue
            codes = values * levels / scale
            assert torch.allclose(codes, codes.round(), atol=1e-3), (key, start)
            assert codes.abs().max() <= levels + 1e-3


def test_a_piece_needs_the_whole_tensors_blocks() -> None:
    x = torch.tensor([1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125])
    whole = quantized(x, block_size=4, levels=127)
    # a piece that starts a block is its own blocks; one that starts inside a block is not
    assert torch.equal(whole[4:], quantized(x[4:], block_size=4, levels=127))
    assert not torch.equal(whole[3:], quantized(x[3:], block_size=4, levels=127))


@pytest.mark.parametrize(
    ("kw", "named"),
    [({"block_size": 0}, "block_size=0"), ({"min_quantized_numel": -1}, "min_quantized_numel=-1"),
     ({"state_dtype": "param"}, "state_dtype='param'"), ({"lr": -1.0}, "lr=-1.0")],
)  # fmt: skip
def test_bad_settings_are_refused_by_name(kw: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        LowBitAdamW([torch.zeros(2, requires_grad=True)], **kw)
