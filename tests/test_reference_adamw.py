"""Claims about ``reference.AdamW``: with torch's conventions it is ``torch.optim.AdamW(foreach=False)``
(and with L2 weight decay ``torch.optim.Adam``) bit for bit, over generated shapes, dtypes,
hyperparameters, steps and missing gradients, and with ``kernels="foreach"`` their ``foreach=True``
forms, on every device this machine has; each convention setting changes the result; bad
settings are refused by name.

Why bitwise: the reference runs torch's single-tensor arithmetic operation for operation
(``reference/adamw.py``), on the same device, so the same bits are the claim.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.verdicts.compare import compare
from reference import AdamW

SHAPES = st.sampled_from([(), (1,), (7,), (4, 4), (33, 7), (2, 3, 5), (0, 3)])


def _space(name: str) -> st.SearchStrategy:
    return st.sampled_from(AdamW.SPACE[name])


@st.composite
def _runs(draw: st.DrawFn) -> dict:
    return dict(
        shape=draw(SHAPES),
        dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])),
        steps=draw(st.integers(1, 4)),
        seed=draw(st.integers(0, 2**16)),
        missing=draw(st.sets(st.integers(0, 3))),
        kw={k: draw(_space(k)) for k in ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize")},
    )


DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


def _trajectory(make, run: dict, device: str = "cpu") -> tuple[torch.Tensor, dict]:
    gen = torch.Generator().manual_seed(run["seed"])
    p = torch.randn(run["shape"], generator=gen).to(device, run["dtype"]).requires_grad_()
    opt = make([p])
    for step in range(run["steps"]):
        g = torch.randn(run["shape"], generator=gen).to(device, run["dtype"])
        p.grad = None if step in run["missing"] else g
        opt.step()
    return p.detach(), opt.state.get(p, {})


def _assert_same_bits(ours: tuple[torch.Tensor, dict], torchs: tuple[torch.Tensor, dict]) -> None:
    assert compare(torchs[0], ours[0], tensor="param").passed
    assert ours[1].keys() == torchs[1].keys()
    for key, value in torchs[1].items():
        c = compare(value, ours[1][key], tensor=key)
        assert c.passed, c.line()


@pytest.mark.parametrize("device", DEVICES)
@given(run=_runs())
@settings(max_examples=300, deadline=None)
def test_reference_adamw_is_torch_adamw_for_loop_bitwise(device: str, run: dict) -> None:
    ours = _trajectory(lambda ps: AdamW(ps, **run["kw"]), run, device)
    torchs = _trajectory(lambda ps: torch.optim.AdamW(ps, foreach=False, **run["kw"]), run, device)
    _assert_same_bits(ours, torchs)


@given(run=_runs())
@settings(max_examples=100, deadline=None)
def test_reference_with_l2_weight_decay_is_torch_adam_for_loop_bitwise(run: dict) -> None:
    ours = _trajectory(lambda ps: AdamW(ps, weight_decay_form="l2", **run["kw"]), run)
    torchs = _trajectory(lambda ps: torch.optim.Adam(ps, foreach=False, **run["kw"]), run)
    _assert_same_bits(ours, torchs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("torch_class", [torch.optim.AdamW, torch.optim.Adam])
@given(run=_runs())
@settings(max_examples=100, deadline=None)
def test_reference_with_foreach_kernels_is_torch_foreach_adam_bitwise(torch_class, device: str, run: dict) -> None:
    form = "decoupled" if torch_class is torch.optim.AdamW else "l2"
    ours = _trajectory(lambda ps: AdamW(ps, weight_decay_form=form, kernels="foreach", **run["kw"]), run, device)
    torchs = _trajectory(lambda ps: torch_class(ps, foreach=True, **run["kw"]), run, device)
    _assert_same_bits(ours, torchs)


@pytest.mark.parametrize("device", DEVICES)
@given(run=_runs())
@settings(max_examples=50, deadline=None)
def test_reference_with_default_kernels_is_torch_adamw_at_its_default_bitwise(device: str, run: dict) -> None:
    """``kernels="default"`` is ``torch.optim.AdamW(foreach=None)``: foreach on CUDA, single-tensor on the CPU."""
    ours = _trajectory(lambda ps: AdamW(ps, kernels="default", **run["kw"]), run, device)
    torchs = _trajectory(lambda ps: torch.optim.AdamW(ps, **run["kw"]), run, device)
    _assert_same_bits(ours, torchs)


@pytest.mark.parametrize(
    "convention",
    [
        {"weight_decay_form": "l2"},
        {"bias_correction": False},
        {"eps_form": "inside"},
        {"state_dtype": "float32"},
        {"amsgrad": True},
        {"maximize": True},
        {"kernels": "foreach"},
    ],
)
def test_every_convention_changes_the_result(convention: dict) -> None:
    """No setting is dead: each, alone, moves a bf16 parameter off torch's bits within three steps."""
    run = dict(
        shape=(16, 9),
        dtype=torch.bfloat16,
        steps=3,
        seed=3,
        missing=set(),
        kw=dict(lr=0.1, eps=1e-3, betas=(0.9, 0.5), weight_decay=0.1),
    )
    ours = _trajectory(lambda ps: AdamW(ps, **run["kw"], **convention), run)
    torchs = _trajectory(lambda ps: torch.optim.AdamW(ps, foreach=False, **run["kw"]), run)
    assert not compare(torchs[0], ours[0], tensor="param").passed


def test_float32_state_stays_float32_through_a_state_dict_round_trip() -> None:
    p = torch.randn(5, 3).bfloat16().requires_grad_()
    opt = AdamW([p], state_dtype="float32")
    p.grad = torch.randn(5, 3).bfloat16()
    opt.step()
    fresh = AdamW([p], state_dtype="float32")
    fresh.load_state_dict(opt.state_dict())
    assert fresh.state[p]["exp_avg"].dtype == torch.float32
    assert torch.equal(fresh.state[p]["exp_avg_sq"], opt.state[p]["exp_avg_sq"])


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"lr": -1.0}, "lr=-1.0"),
        ({"betas": (0.9, 1.0)}, "betas=(0.9, 1.0)"),
        ({"eps": -1e-8}, "eps=-1e-08"),
        ({"weight_decay": -0.1}, "weight_decay=-0.1"),
        ({"weight_decay_form": "coupled"}, "weight_decay_form='coupled'"),
        ({"eps_form": "under"}, "eps_form='under'"),
        ({"state_dtype": "bf16"}, "state_dtype='bf16'"),
        ({"amsgrad": 1}, "amsgrad=1"),
        ({"momentum": 0.9}, "unknown setting(s) ['momentum']"),
        ({"kernels": "fused"}, "kernels='fused' is not one of"),
        ({"kernels": "foreach", "eps_form": "inside"}, "eps_form='inside' cannot be taken with kernels='foreach'"),
    ],
)
def test_bad_settings_are_refused_by_name(settings: dict, named: str) -> None:
    with pytest.raises(ValueError) as e:
        AdamW([torch.zeros(2, requires_grad=True)], **settings)
    assert named in str(e.value)
