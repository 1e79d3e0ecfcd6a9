"""Claims about ``reference.NorMuon``: with the authors' conventions it is their algorithm
(written out here afresh from the paper and their ``normuon.py``, in float32), each of its
conventions changes the result, its statistics are float32 through a checkpoint, and bad
settings are refused by name."""

from __future__ import annotations

import math

import pytest
import torch

from reference import NorMuon, orthogonalize


def _authors(w: torch.Tensor, grads: list[torch.Tensor], lr: float, wd: float, beta2: float) -> torch.Tensor:
    """The authors' NorMuon step by step: EMA momentum with Nesterov, Keller's quintic in
    bf16, the mean square of each row, ``O / (√v + 1e-10)``, the norm restored, Muon's
    ``√max(1, rows/cols)``, decoupled decay first."""
    w = w.clone()
    m = torch.zeros_like(w)
    v = torch.zeros(w.shape[0], 1)
    for g in grads:
        m.lerp_(g, 1 - 0.95)
        u = g.lerp(m, 0.95)
        o = orthogonalize(u, 5, dtype=torch.bfloat16).float()
        n = o.norm()
        v.lerp_((o * o).mean(dim=-1, keepdim=True), 1 - beta2)
        o = o / (v.sqrt() + 1e-10)
        o = o * (n / (o.norm() + 1e-10))
        w.mul_(1 - lr * wd)
        w.add_(o, alpha=-lr * math.sqrt(max(1.0, w.shape[0] / w.shape[1])))
    return w


@pytest.mark.parametrize("shape", [(8, 4), (4, 8), (5, 5)])
def test_normuon_with_the_authors_conventions_is_their_algorithm(shape: tuple[int, int]) -> None:
    torch.manual_seed(0)
    w0 = torch.randn(shape)
    grads = [torch.randn(shape) for _ in range(3)]
    p = torch.nn.Parameter(w0.clone())
    opt = NorMuon([p], lr=0.02, weight_decay=0.1, beta2=0.9)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    torch.testing.assert_close(p.detach(), _authors(w0, grads, 0.02, 0.1, 0.9), rtol=1e-6, atol=1e-7)


def _stepped(**settings: object) -> torch.Tensor:
    torch.manual_seed(1)
    p = torch.nn.Parameter(torch.randn(6, 10))
    opt = NorMuon([p], **settings)
    for _ in range(2):
        p.grad = torch.randn(6, 10)
        opt.step()
    return p.detach().clone()


@pytest.mark.parametrize(
    "convention",
    [
        {"normuon_axis": "shape"},
        {"normuon_denominator": "clamp", "normuon_eps": 1e-3},
        {"normuon_scale": "rms"},
        {"normuon_eps": 1e-2},
        {"beta2": 0.5},
    ],
)
def test_every_normuon_convention_changes_the_result(convention: dict[str, object]) -> None:
    assert not torch.equal(_stepped(), _stepped(**convention)), convention


def test_a_tall_matrix_transposed_sums_in_another_order_within_an_ulp_and_a_wide_one_is_unchanged() -> None:
    """``normuon_tall="transposed"`` (pytorch-optimizer's layout of Newton–Schulz's output) changes
    only the order of the sums over a tall matrix: some draws differ, by rounding alone."""

    def stepped(shape: tuple[int, int], seed: int, tall: str) -> torch.Tensor:
        torch.manual_seed(seed)
        p = torch.nn.Parameter(torch.randn(shape))
        p.grad = torch.randn(shape)
        NorMuon([p], normuon_tall=tall).step()
        return p.detach()

    differ = 0
    for seed in range(20):
        row_major, transposed = stepped((31, 13), seed, "row_major"), stepped((31, 13), seed, "transposed")
        torch.testing.assert_close(transposed, row_major, rtol=0, atol=1e-6)
        differ += not torch.equal(row_major, transposed)
        assert torch.equal(stepped((13, 31), seed, "row_major"), stepped((13, 31), seed, "transposed"))
    assert differ > 0


def test_the_statistics_are_float32_and_survive_a_checkpoint_of_a_bf16_parameter() -> None:
    p = torch.nn.Parameter(torch.randn(4, 6).bfloat16())
    opt = NorMuon([p], normuon_axis="shape")
    p.grad = torch.randn(4, 6).bfloat16()
    opt.step()
    v = opt.state[p]["second_moment"]
    assert v.dtype == torch.float32 and v.shape == (1, 6)
    again = NorMuon([p], normuon_axis="shape")
    again.load_state_dict(opt.state_dict())
    assert torch.equal(again.state[p]["second_moment"], v) and again.state[p]["second_moment"].dtype == torch.float32


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"normuon_axis": "cols"}, "normuon_axis"),
        ({"normuon_denominator": "sqrt"}, "normuon_denominator"),
        ({"normuon_scale": "spectral"}, "normuon_scale"),
        ({"beta2": 1.0}, "beta2"),
        ({"normuon_eps": 0.0}, "normuon_eps"),
        ({"momentum": 1.5}, "momentum"),
        ({"beta3": 0.9}, "beta3"),
    ],
)
def test_bad_normuon_settings_are_refused_by_name(settings: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        NorMuon([torch.nn.Parameter(torch.randn(3, 3))], **settings)


@pytest.mark.parametrize("blocks", [{"ns_split": (1, 3, 4)}, {"ns_heads": 2}])
def test_each_row_block_steps_with_its_own_lr_scale_after_the_normalization(blocks: dict) -> None:
    """Row blocks (microsoft/dion's ``split_sizes``): Newton–Schulz per block, the statistics and
    norms of the whole matrix, then each block's own lr scale. The lr scale comes after the
    normalization, so a run whose scale follows a block's rows (``match_rms_adamw``) and one
    without any (``none``) differ row by row by each block's own scale, not by the whole
    matrix's (a scale applied before the normalization cancels: dion's pull request 113)."""
    torch.manual_seed(0)
    grad = torch.randn(8, 2)
    steps = {}
    for adjust in ("match_rms_adamw", "none"):
        p = torch.nn.Parameter(torch.zeros(8, 2))
        p.grad = grad.clone()
        NorMuon([p], lr=0.1, weight_decay=0.0, adjust_lr_fn=adjust, **blocks).step()
        steps[adjust] = p.detach().clone()
    ratio = (steps["match_rms_adamw"] / steps["none"])[:, 0]
    sizes = blocks.get("ns_split") or (8 // blocks["ns_heads"],) * blocks["ns_heads"]
    expected = torch.cat([torch.full((n,), 0.2 * math.sqrt(max(n, 2))) for n in sizes])
    torch.testing.assert_close(ratio, expected)
    assert not torch.allclose(ratio, torch.full((8,), 0.2 * math.sqrt(8))), "the whole matrix's scale"
