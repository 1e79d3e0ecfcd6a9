"""Claim: ShardedMuon rejects inputs it cannot handle with an error naming the parameter,
its shape, its placements and the rank, on real DTensors."""

from __future__ import annotations

from harness.ranks import RankPool
from harness.runner import RANK_PRELOAD
from harness.tasks import selftest as selftest_tasks


def test_bad_parameters_are_named_with_shape_placement_and_rank():
    with RankPool(2, preload=RANK_PRELOAD) as pool:
        outcome = pool.run(selftest_tasks.sharded_muon_errors)
    assert outcome.ok, outcome.failure and outcome.failure.describe()
    for rank, errors in enumerate(outcome.results):
        plain, partial, bias = errors
        assert plain.startswith("TypeError: parameter 'plain' of shape (3, 3) with placements plain tensor")
        assert f"on rank {rank}" in plain and "expected a DTensor" in plain
        assert partial.startswith("ValueError: parameter 'partial' of shape (6, 4) with placements (Partial(sum),)")
        assert "not a layout of a parameter" in partial
        assert bias.startswith("ValueError: parameter 'bias' of shape (8,)") and "use_muon=False" in bias
