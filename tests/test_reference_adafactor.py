"""Claims about ``reference.Adafactor``: it is ``torch.optim.Adafactor(foreach=False)`` bit for bit
over generated shapes (vectors, matrices, stacks), dtypes, settings, steps and missing gradients,
and it refuses bad settings by name.

Why bitwise: the reference runs torch's single-tensor arithmetic operation for operation, on
the same device (``reference/adafactor.py``)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.verdicts.compare import compare
from reference import Adafactor


@st.composite
def _runs(draw: st.DrawFn) -> dict:
    return dict(
        shape=draw(st.sampled_from([(1,), (7,), (4, 4), (33, 7), (1, 9), (2, 3, 5)])),
        dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])),
        steps=draw(st.integers(1, 4)),
        seed=draw(st.integers(0, 2**16)),
        missing=draw(st.sets(st.integers(0, 3))),
        kw={name: draw(st.sampled_from(values)) for name, values in Adafactor.SPACE.items()},
    )


def _trajectory(make, run: dict) -> tuple[torch.Tensor, dict]:
    gen = torch.Generator().manual_seed(run["seed"])
    p = torch.randn(run["shape"], generator=gen).to(run["dtype"]).requires_grad_()
    opt = make([p])
    for step in range(run["steps"]):
        g = torch.randn(run["shape"], generator=gen).to(run["dtype"])
        p.grad = None if step in run["missing"] else g
        opt.step()
    return p.detach(), opt.state.get(p, {})


@given(run=_runs())
@settings(max_examples=300, deadline=None)
def test_reference_adafactor_is_torch_adafactor_for_loop_bitwise(run: dict) -> None:
    ours = _trajectory(lambda ps: Adafactor(ps, **run["kw"]), run)
    torchs = _trajectory(lambda ps: torch.optim.Adafactor(ps, foreach=False, **run["kw"]), run)
    assert compare(torchs[0], ours[0], tensor="param").passed
    assert ours[1].keys() == torchs[1].keys()
    for key, value in torchs[1].items():
        c = compare(value, ours[1][key], tensor=key)
        assert c.passed, c.line()


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"lr": -1.0}, "lr=-1.0"),
        ({"beta2_decay": 0.5}, "beta2_decay=0.5"),
        ({"eps": (None, -1.0)}, "eps=(None, -1.0)"),
        ({"d": 0.5}, "d=0.5"),
        ({"weight_decay": -0.1}, "weight_decay=-0.1"),
        ({"betas": (0.9, 0.99)}, "unknown setting(s) ['betas']"),
    ],
)
def test_bad_settings_are_refused_by_name(settings: dict, named: str) -> None:
    with pytest.raises(ValueError) as e:
        Adafactor([torch.zeros(2, requires_grad=True)], **settings)
    assert named in str(e.value)
