"""Claims about same-shape batching: it is used only after one step proved it gives the
one-by-one bits, and a batched kernel that disagrees is caught and never used."""

from __future__ import annotations

import torch

from distributed_impl import batching
from reference import MUON_DEFAULTS, orthogonalize_batch

GROUP = dict(MUON_DEFAULTS)


def _one_by_one(matrices):
    one = batching.group_orthogonalizer(GROUP)  # the reference's own orthogonalize
    return [one(m) for m in matrices]


def _matrices(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(12, 7, generator=gen) for _ in range(4)] + [torch.randn(5, 9, generator=gen)]


def test_stack_is_batched_after_the_first_step_proved_it_bitwise():
    policy = batching.SameShapeBatching()
    run = policy.orthogonalizer(GROUP, None)
    for seed in range(3):
        got = run(_matrices(seed))
        assert all(batching.same_bits(a, b) for a, b in zip(got, _one_by_one(_matrices(seed)), strict=True))
    assert list(policy.verdicts.values()) == [True]  # the 4 × 12×7 stack; the lone 5×9 is never stacked


def test_batched_kernel_that_differs_is_caught_and_never_used(monkeypatch):
    def off_by_a_bit(G, *args, **kwargs):
        return orthogonalize_batch(G, *args, **kwargs) * 1.01  # more than bf16's rounding step

    monkeypatch.setattr(batching, "orthogonalize_batch", off_by_a_bit)
    policy = batching.SameShapeBatching()
    run = policy.orthogonalizer(GROUP, None)
    for seed in range(2):
        got = run(_matrices(seed))
        assert all(batching.same_bits(a, b) for a, b in zip(got, _one_by_one(_matrices(seed)), strict=True))
    assert list(policy.verdicts.values()) == [False]


def test_same_bits_tells_signed_zeros_apart():
    assert not batching.same_bits(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert batching.same_bits(torch.tensor([1.5]), torch.tensor([1.5]))
