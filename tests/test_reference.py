"""Claims about ``reference.Muon``: it is torch.optim.Muon where their conventions agree,
its Newton–Schulz lands singular values in the quintic's known band, and it rejects
bad arguments by name.

The one known difference from torch.optim.Muon is precision on bf16 parameters: torch
keeps the momentum in bf16 and rounds the parameter twice (after weight decay and after
the update); the reference keeps float32 state and rounds once, because bf16
``add(alpha=…)`` on the CPU rounds differently in a loop's vector body and its scalar
tail, which would make a shard's bits depend on the shard's length. The bf16 test
proves that this is the *only* difference by replaying torch's bf16 arithmetic with the
reference's own Newton–Schulz and getting torch's bits exactly.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

from harness.cases.tensors import spectrum_matrix
from reference import Muon, orthogonalize
from reference.muon import lr_scale, momentum_update

TORCH_CONVENTIONS = dict(
    momentum_form="ema", eps_form="clamp", ns_coefficients="keller", ns_dtype=torch.bfloat16, adjust_lr_fn="original"
)
SHAPES = [(16, 16), (33, 7), (7, 33), (1, 64), (64, 1)]


def _run(opt_cls, p0, grads, **kw):
    p = p0.clone().requires_grad_()
    opt = opt_cls([p], **kw)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    return p.detach(), opt


def _inputs(shape, dtype, steps=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    p0 = torch.randn(shape, generator=gen).to(dtype)
    return p0, [torch.randn(shape, generator=gen).to(dtype) for _ in range(steps)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("adjust_lr_fn", ["original", "match_rms_adamw"])
def test_reference_matches_torch_optim_muon_bitwise_on_fp32(shape, nesterov, adjust_lr_fn):
    p0, grads = _inputs(shape, torch.float32)
    kw = dict(lr=0.02, weight_decay=0.1, momentum=0.9, nesterov=nesterov)
    ours, _ = _run(Muon, p0, grads, **{**kw, **TORCH_CONVENTIONS, "adjust_lr_fn": adjust_lr_fn})
    theirs, _ = _run(torch.optim.Muon, p0, grads, **kw, adjust_lr_fn=adjust_lr_fn)
    assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32))


def _torch_bf16_arithmetic(p0, grads, lr, wd, mu, nesterov):
    """torch.optim.Muon's bf16 parameter arithmetic, with the reference's Newton–Schulz."""
    p, buf = p0.clone(), torch.zeros_like(p0)
    for g in grads:
        buf.lerp_(g, 1 - mu)
        update = g.lerp(buf, mu) if nesterov else buf
        o = orthogonalize(update, 5, eps_form="clamp", dtype=torch.bfloat16)
        p.mul_(1 - lr * wd)
        p.add_(o, alpha=-lr * lr_scale(p.shape, "original"))
    return p


@pytest.mark.parametrize("shape", SHAPES)
def test_reference_differs_from_torch_optim_muon_on_bf16_only_by_its_float32_state(shape):
    p0, grads = _inputs(shape, torch.bfloat16)
    theirs, _ = _run(torch.optim.Muon, p0, grads, lr=0.02, weight_decay=0.1, momentum=0.9, nesterov=True)
    replayed = _torch_bf16_arithmetic(p0, grads, 0.02, 0.1, 0.9, True)
    assert torch.equal(theirs.view(torch.int16), replayed.view(torch.int16))
    ours, _ = _run(Muon, p0, grads, lr=0.02, weight_decay=0.1, momentum=0.9, **TORCH_CONVENTIONS)
    # Rounding once instead of twice, from float32 momentum: a few bf16 ULPs after 3 steps.
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=0, atol=4 * 2.0**-7 * float(p0.abs().max()))


@pytest.mark.parametrize("shape", [(64, 64), (128, 32), (32, 128), (100, 37)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quintic_singular_values_lie_in_its_known_band_against_float64_svd(shape, dtype):
    # Chosen singular values: a random matrix's near-zero one would not reach the band.
    G = spectrum_matrix(*shape, torch.Generator().manual_seed(1))
    U, _, Vh = torch.linalg.svd(G, full_matrices=False)
    V = Vh.T
    ortho = orthogonalize(G, 5, dtype=dtype).double()
    sv = torch.linalg.svdvals(ortho)
    assert float(sv.min()) >= 0.65 and float(sv.max()) <= 1.25, (float(sv.min()), float(sv.max()))
    # Same singular vectors as the exact polar factor U Vᵀ: ortho ≈ U diag(s') Vᵀ.
    core = U.T @ ortho @ V
    off_diag = core - torch.diag(torch.diagonal(core))
    assert float(off_diag.abs().max()) < 0.05


def test_three_d_tensor_is_each_expert_orthogonalized_on_its_own():
    G = torch.randn(3, 9, 5, generator=torch.Generator().manual_seed(2))
    batched = orthogonalize(G, 5)
    one_by_one = torch.stack([orthogonalize(m, 5) for m in G])
    assert torch.equal(batched.view(torch.int16), one_by_one.view(torch.int16))


def test_orthogonalize_never_writes_its_input_even_when_it_skips_the_copy():
    G = torch.randn(12, 5, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    before = G.clone()
    out = orthogonalize(G, 5)  # already bf16, contiguous, a whole allocation: read in place
    assert torch.equal(G.view(torch.int16), before.view(torch.int16))
    assert out.data_ptr() != G.data_ptr()


@pytest.mark.parametrize("momentum_form", ["ema", "sum"])
@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_momentum_update_written_into_out_matches_rounding_the_float32_update_bitwise(momentum_form, nesterov, dtype):
    gen = torch.Generator().manual_seed(4)
    buf, grad = torch.randn(1037, generator=gen), torch.randn(1037, generator=gen) * 3
    expected = momentum_update(buf.clone(), grad, 0.95, nesterov, momentum_form).to(dtype)
    out = torch.empty(1037, dtype=dtype)
    momentum_update(buf, grad, 0.95, nesterov, momentum_form, out=out)
    assert torch.equal(
        out.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
        expected.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
    )


def test_parameter_without_gradient_is_skipped_entirely():
    a = torch.nn.Parameter(torch.ones(4, 4))
    b = torch.nn.Parameter(torch.ones(4, 4))
    opt = Muon([a, b], weight_decay=0.5)
    a.grad = torch.randn(4, 4)
    opt.step()
    assert torch.equal(b, torch.ones(4, 4)) and b not in opt.state


@pytest.mark.parametrize("device", ["cpu", *(["cuda"] if torch.cuda.is_available() else [])])
@pytest.mark.parametrize(("kernels", "foreach"), [("single_tensor", False), ("foreach", True), ("default", None)])
def test_adamw_group_matches_torch_adamw_bitwise_on_each_of_its_kernels(device: str, kernels: str, foreach) -> None:
    """``adamw_kernels``: ``"single_tensor"`` is ``torch.optim.AdamW(foreach=False)``, ``"foreach"``
    its ``foreach=True`` and ``"default"`` what it chooses with ``foreach=None`` on the device
    (its foreach kernels on CUDA, a few ULP from its single-tensor ones there)."""
    p0, grads = _inputs((33, 7), torch.float32, steps=5)
    p0, grads = p0.to(device), [g.to(device) for g in grads]
    hyper = dict(adamw_lr=1e-2, adamw_betas=(0.9, 0.99), adamw_eps=1e-8, adamw_weight_decay=0.1)
    ours, _ = _run(Muon, p0, grads, use_muon=False, adamw_kernels=kernels, **hyper)
    theirs, _ = _run(
        torch.optim.AdamW, p0, grads, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, foreach=foreach
    )
    assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32))


def test_the_lerp_form_and_the_groups_step_count_bias_correct_a_late_first_gradient_as_the_groups_third_step():
    """``adamw_form="lerp"`` keeps ``v`` by ``lerp`` of the squared gradient; ``adamw_steps="group"``
    counts the optimizer's steps, so a parameter whose first gradient comes at the third step is
    bias-corrected as a third step, where torch's count makes it a first."""
    from reference import adamw_update

    p0, (grad, *_) = _inputs((5, 3), torch.float32)
    p = p0.clone().requires_grad_()
    other = torch.zeros(2, 2, requires_grad=True)
    hyper = dict(adamw_lr=1e-2, adamw_betas=(0.9, 0.99), adamw_eps=1e-8, adamw_weight_decay=0.1)
    opt = Muon([{"params": [p, other], "use_muon": False}], adamw_form="lerp", adamw_steps="group", **hyper)
    for step in range(3):
        other.grad = torch.ones(2, 2)
        p.grad = grad.clone() if step == 2 else None
        opt.step()

    def expected(step: int, squares: str) -> torch.Tensor:
        w, m, v = p0.clone(), torch.zeros(5, 3), torch.zeros(5, 3)
        adamw_update(w, grad, m, v, step, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, squares=squares)  # type: ignore[arg-type]
        return w

    assert torch.equal(p.detach(), expected(3, "lerp"))
    assert not torch.equal(expected(3, "lerp"), expected(1, "lerp"))


@pytest.mark.parametrize(
    ("kwargs", "params", "message"),
    [
        ({"lr": -0.1}, [torch.zeros(3, 3)], "lr=-0.1 must be >= 0"),
        ({"momentum": 1.0}, [torch.zeros(3, 3)], "momentum=1.0 must be in"),
        ({"momentum": -0.5}, [torch.zeros(3, 3)], "momentum=-0.5 must be in"),
        ({"weight_decay": -1.0}, [torch.zeros(3, 3)], "weight_decay=-1.0 must be >= 0"),
        ({}, [torch.zeros(3)], r"shape \(3,\): Muon takes 2-D"),
        ({"momentum_form": "heavy"}, [torch.zeros(3, 3)], "momentum_form='heavy' is not one of"),
        ({"eps_form": "max"}, [torch.zeros(3, 3)], "eps_form='max' is not one of"),
        ({"adjust_lr_fn": "spectral"}, [torch.zeros(3, 3)], "adjust_lr_fn='spectral' is not one of"),
        ({"ns_coefficients": "cubic"}, [torch.zeros(3, 3)], "ns_coefficients='cubic' is not"),
        ({"ns_dtype": torch.float16}, [torch.zeros(3, 3)], "ns_dtype=torch.float16 must be"),
        ({"ns_steps": -1}, [torch.zeros(3, 3)], "ns_steps=-1 must be"),
        ({"eps": 0.0}, [torch.zeros(3, 3)], "eps=0.0 must be > 0"),
        ({"adamw_betas": (0.9, 1.0)}, [torch.zeros(3, 3)], "adamw_betas=.* must both be in"),
        ({"nesterov_mode": True}, [torch.zeros(3, 3)], "unknown setting"),
        ({"adamw_kernels": "fused"}, [torch.zeros(3, 3)], "adamw_kernels='fused' is not one of"),
        ({"adamw_kernels": "foreach", "adamw_form": "keller"}, [torch.zeros(3, 3)], "takes adamw_form='torch'"),
    ],
)
def test_bad_arguments_raise_value_error_naming_the_value(kwargs, params, message):
    with pytest.raises(ValueError, match=message):
        Muon([torch.nn.Parameter(p) for p in params], **kwargs)


# -- the forms that express another Muon's arithmetic (DeepSpeed's; reference.muon.FORM_DEFAULTS) --


@pytest.mark.peers
@pytest.mark.parametrize("device", ["cpu", *(["cuda"] if torch.cuda.is_available() else [])])
def test_batched_stacks_are_torchtitans_newton_schulz_bit_for_bit(device: str) -> None:
    """``ns_stacks="batched"`` on torch.optim.Muon's conventions is the Newton–Schulz of
    torchtitan 0.3.0's ``DistMuon`` on stacks of 2 to 6 experts (one batched product, the
    stack's norms in one reduction), bit for bit over 200 stacks, where one matrix at a time is
    not always (1 of 200 on the CPU, 66 on one H100); ``ns_stacks=2`` is it on each of the two
    chunks two ranks hold."""
    from examples.torchtitan_adapter import _flex_shard

    try:
        _flex_shard()
    except ImportError as missing:
        pytest.skip(str(missing))
    from torchtitan.distributed.flex_shard.dist_muon import _zeropower_via_newtonschulz as theirs

    conventions = dict(ns_coefficients="keller", eps=1e-7, eps_form="clamp", dtype=torch.bfloat16)
    differ = []
    for seed in range(200):
        gen = torch.Generator().manual_seed(seed)
        experts, rows, cols = (int(torch.randint(lo, hi, (1,), generator=gen)) for lo, hi in ((2, 7), (1, 40), (1, 40)))
        G = torch.randn(experts, rows, cols, generator=gen).to(device)
        expected = theirs(G, ns_coefficients=(3.4445, -4.7750, 2.0315), ns_steps=5, eps=1e-7).contiguous()
        ours = orthogonalize(G, 5, ns_stacks="batched", **conventions)
        by_rank = torch.cat(
            [theirs(c, ns_coefficients=(3.4445, -4.7750, 2.0315), ns_steps=5, eps=1e-7) for c in G.chunk(2)]
        )
        chunked = orthogonalize(G, 5, ns_stacks=2, **conventions)
        if not torch.equal(ours.view(torch.int16), expected.view(torch.int16)):
            differ.append(("whole", experts, rows, cols))
        if not torch.equal(chunked.view(torch.int16), by_rank.contiguous().view(torch.int16)):
            differ.append(("chunks", experts, rows, cols))
    assert not differ, differ


def test_batched_stacks_take_the_addmm_form_and_a_positive_number_of_chunks_only() -> None:
    with pytest.raises(ValueError, match="ns_stacks='batched' batches the addmm form"):
        Muon([torch.nn.Parameter(torch.zeros(2, 3, 3))], ns_stacks="batched", ns_form="gram")
    with pytest.raises(ValueError, match="ns_stacks=0 is not 'each', 'batched' or a number of chunks"):
        Muon([torch.nn.Parameter(torch.zeros(2, 3, 3))], ns_stacks=0)


def test_the_form_settings_are_taken_but_not_handed_to_candidates_nor_drawn() -> None:
    from reference.muon import FORM_DEFAULTS

    assert not set(FORM_DEFAULTS) & set(Muon.DEFAULTS), "a candidate would be handed them"
    assert not set(FORM_DEFAULTS) & {*Muon.SPACE, *Muon.CONVENTIONS}, "the gates would draw them"
    p0, grads = _inputs((7, 5), torch.float32)
    assert torch.equal(_run(Muon, p0, grads)[0], _run(Muon, p0, grads, **FORM_DEFAULTS)[0])


@pytest.mark.parametrize("shape", [*SHAPES, (5, 5), (3, 17)])
@pytest.mark.parametrize("form", ["gram", "gram_addmm"])
def test_gram_forms_orthogonalize_as_the_expanded_form_does_in_float64(shape: tuple[int, int], form: str) -> None:
    """The same polynomial of the same matrix, restart and all: in float64 the Gram forms and
    the plain iteration agree to roundoff (a wrong Q, R or restart lands far from it)."""
    G = torch.randn(shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    plain = orthogonalize(G, 5, dtype=torch.float64, ns_form="expanded")
    gram = orthogonalize(G, 5, dtype=torch.float64, ns_form=form)
    assert torch.allclose(gram, plain, rtol=0, atol=1e-9), (gram - plain).abs().max()


def test_float16_newton_schulz_is_taken_with_a_gram_form_and_lr_scale_on_update_rounds_there() -> None:
    p0, grads = _inputs((9, 4), torch.float32)
    ours, _ = _run(Muon, p0, grads, ns_form="gram", ns_dtype=torch.float16, lr_scale_on="update")
    scaled_lr, _ = _run(Muon, p0, grads, ns_form="gram", ns_dtype=torch.float16)
    assert torch.isfinite(ours).all() and not torch.equal(ours, scaled_lr)  # √(9/4) rounded in fp16 first
    with pytest.raises(ValueError, match="ns_form='gramm' is not one of"):
        Muon([torch.zeros(3, 3, requires_grad=True)], ns_form="gramm")


# -- the unit Newton–Schulz orthogonalizes: row blocks (``ns_heads``, ``ns_split``) ----------------


def _blocks_stepped(
    shape: tuple[int, ...], blocks: tuple[int, ...], setting: dict[str, Any], steps: int = 3, **settings: Any
) -> tuple[Tensor, Tensor]:
    """One matrix stepped with row blocks (``setting``), and each block of it stepped as a matrix
    of its own (the same gradients, rows by rows, in a group without blocks), laid back together."""
    torch.manual_seed(7)
    p0, grads = torch.randn(shape), [torch.randn(shape) for _ in range(steps)]
    whole = torch.nn.Parameter(p0.clone())
    pieces = [torch.nn.Parameter(b.clone()) for b in p0.split(blocks, dim=-2)]
    a = Muon([{"params": [whole], "use_muon": True, **setting}], **settings)
    b = Muon([{"params": pieces, "use_muon": True}], **settings)
    for g in grads:
        whole.grad = g.clone()
        for piece, rows in zip(pieces, g.split(blocks, dim=-2), strict=True):
            piece.grad = rows.clone()
        a.step()
        b.step()
    return whole.detach(), torch.cat([piece.detach() for piece in pieces], dim=-2)


@pytest.mark.parametrize(
    ("shape", "blocks", "setting"),
    [
        ((12, 8), (4, 4, 4), {"ns_heads": 3}),
        ((8, 12), (4, 4), {"ns_heads": 2}),  # tall heads of a wide matrix
        ((6, 4), (1,) * 6, {"ns_heads": 6}),
        ((2, 10, 6), (5, 5), {"ns_heads": 2}),  # a stack of experts
        ((9, 5), (9,), {"ns_heads": 1}),
        ((12, 8), (8, 2, 2), {"ns_split": (8, 2, 2)}),  # a fused QKV under GQA: unequal lr scales
        ((7, 3), (1, 6), {"ns_split": [1, 6]}),
        ((2, 9, 4), (3, 6), {"ns_split": (3, 6)}),
    ],
)
@pytest.mark.parametrize("adjust_lr_fn", ["original", "match_rms_adamw"])
def test_each_row_block_steps_as_a_matrix_of_its_own_with_its_own_lr_scale(
    shape: tuple[int, ...], blocks: tuple[int, ...], setting: dict[str, Any], adjust_lr_fn: str
) -> None:
    together, separate = _blocks_stepped(shape, blocks, setting, weight_decay=0.1, adjust_lr_fn=adjust_lr_fn)
    assert torch.equal(together.view(torch.int32), separate.view(torch.int32)), "the same bits"


@pytest.mark.parametrize(
    ("shape", "heads", "forms"),
    [
        ((8, 4), 2, {}),
        ((12, 8), 3, {"ns_form": "gram", "ns_dtype": torch.float32, "ns_normalize": "input"}),  # DeepSpeed's
        ((8, 12), 2, {"ns_form": "expanded"}),  # tall heads of a wide matrix
        ((2, 10, 6), 2, {}),  # a stack of experts: every expert's heads in one stack
    ],
)
def test_batched_heads_are_one_stack_orthogonalized_in_batched_products(
    shape: tuple[int, ...], heads: int, forms: dict[str, Any]
) -> None:
    """``ns_blocks="batched"`` is DeepSpeed's per-head view: the update's heads as one stack
    ``[h, rows/h, cols]`` through ``orthogonalize_batch``, then laid back, whatever bits the
    batched kernel gives on this CPU (it may differ from ``"each"``: that is why the setting exists)."""
    from reference.muon import group_orthogonalizer, orthogonalize_batch

    torch.manual_seed(3)
    update = torch.randn(shape)
    group = {"ns_steps": 5, "ns_coefficients": "keller", "eps": 1e-7, "eps_form": "add", "ns_dtype": torch.bfloat16}
    group |= forms
    got = group_orthogonalizer({**group, "ns_heads": heads, "ns_blocks": "batched"})(update)
    rows, cols = shape[-2:]
    kw = {k: group[k] for k in ("ns_form", "ns_normalize") if k in group}
    stack = orthogonalize_batch(
        update.reshape(-1, rows // heads, cols),
        5,
        dtype=group["ns_dtype"],
        **kw,  # type: ignore[arg-type]
    )
    bits = torch.int16 if got.dtype == torch.bfloat16 else torch.int32
    assert torch.equal(got.flatten().view(bits), stack.flatten().view(bits)), "the batched kernel's own bits"
    each = group_orthogonalizer({**group, "ns_heads": heads})(update)
    assert torch.allclose(got.float(), each.float(), rtol=0.02, atol=0.02), "the same arithmetic"


def test_row_blocks_change_the_update_and_one_head_is_the_whole_matrix() -> None:
    whole, _ = _blocks_stepped((12, 8), (12,), {})
    two, _ = _blocks_stepped((12, 8), (6, 6), {"ns_heads": 2})
    split, _ = _blocks_stepped((12, 8), (8, 4), {"ns_split": (8, 4)})
    assert not torch.equal(whole, two) and not torch.equal(two, split)
    torch.manual_seed(7)
    p0, grads = torch.randn(12, 8), [torch.randn(12, 8) for _ in range(3)]
    assert torch.equal(_run(Muon, p0, grads)[0], _run(Muon, p0, grads, ns_heads=1, ns_split=())[0])


@pytest.mark.parametrize(
    ("setting", "shape", "message"),
    [
        ({"ns_heads": 3}, (10, 8), r"'group0.param0' of shape \(10, 8\): ns_heads=3 does not divide the 10 rows"),
        ({"ns_split": (4, 4)}, (9, 8), r"'group0.param0' of shape \(9, 8\): ns_split=\(4, 4\) does not add up to"),
        ({"ns_heads": 0}, (9, 8), "ns_heads=0 must be an int of at least 1"),
        ({"ns_heads": 2.0}, (8, 8), "ns_heads=2.0 must be an int of at least 1"),
        ({"ns_split": (4, 0)}, (4, 8), "ns_split=.* must be a tuple of row counts of at least 1"),
        ({"ns_split": (4, 4), "ns_heads": 2}, (8, 8), "ns_split=.* and ns_heads: give one of them"),
        ({"ns_split": (4, 4), "ns_blocks": "batched"}, (8, 8), "ns_blocks='batched' batches equal heads"),
        ({"ns_heads": 2, "ns_blocks": "stacked"}, (8, 8), "ns_blocks='stacked' is not one of"),
    ],
)
def test_row_blocks_that_do_not_fit_the_rows_are_refused_naming_the_parameter(
    setting: dict[str, Any], shape: tuple[int, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Muon([{"params": [torch.nn.Parameter(torch.zeros(shape))], **setting}])
