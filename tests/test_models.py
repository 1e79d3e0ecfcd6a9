"""Claims about the MoE and transformer models, the text data and the outcome classifier, without a process group."""

from __future__ import annotations

import pytest
import torch

from harness.models.moe import MoECase, round_robin
from harness.ranks import CaseOutcome, RankFailure
from harness.verdicts.outcomes import classify
from reports.records import Comparison


def test_round_robin_moves_tokens_of_empty_experts_to_the_next_allowed_one():
    assert round_robin(8, 4, frozenset()).tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert round_robin(8, 4, frozenset({1, 3})).tolist() == [0, 2, 2, 0, 0, 2, 2, 0]
    with pytest.raises(ValueError, match="every one of the 2 experts"):
        round_robin(4, 2, frozenset({0, 1}))


@pytest.mark.parametrize("wrapping", ["per_expert", "stacked"])
def test_empty_batch_changes_no_numerics_in_one_process(wrapping):
    """An expert run on ``[0, d]`` adds exact zeros: same output and gradients as skipping it."""
    case = MoECase("x", wrapping, "fixed", ())
    x = torch.randn(12, case.dim, generator=torch.Generator().manual_seed(1))
    results = []
    for variant in ("fixed", "naive"):
        model = case.build()
        model.moe.skip_empty, model.moe.routing = variant == "naive", frozenset({2})
        model(x).square().sum().backward()
        results.append(
            [model(x).detach()] + [p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
        )
    for a, b in zip(*results, strict=True):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def _outcome(failure=None, seconds=1.0):
    return CaseOutcome([None, None], failure, seconds)


def test_classifier_names_each_outcome():
    ok = Comparison("w", (2, 2))
    bad = Comparison("w", (2, 2), bitwise=False, passed=False, max_abs_diff=0.5)
    assert classify(_outcome(), [ok]).outcome == "completed"
    corrupt = classify(_outcome(), [ok, bad])
    assert corrupt.outcome == "silent corruption" and "1 of 2" in corrupt.detail
    hang = classify(_outcome(RankFailure("hang", 0, "ranks [0, 1] did not finish before the deadline"), 8.2), [])
    assert hang.outcome == "hang" and hang.seconds == 8.2
    died = RankFailure("died", 1, "noise\nReceived data size doesn't match expected size.\nFatal Python error", -6)
    abort = classify(_outcome(died), [])
    assert abort.outcome == "abort" and "exit code -6" in abort.detail and "doesn't match" in abort.detail
    timeout = classify(_outcome(RankFailure("error", 0, "RuntimeError: Timed out waiting 10000ms for recv")), [])
    assert timeout.outcome == "hang"
    assert classify(_outcome(RankFailure("error", 0, "ValueError: oops")), []).outcome == "error"


def test_the_classifier_names_a_nan_difference_the_worst_wherever_it_came() -> None:
    """A NaN against a number differs by NaN (``harness.verdicts.compare``), which ``max`` alone drops or
    keeps by its place."""
    big = Comparison("w", (2, 2), bitwise=False, passed=False, max_abs_diff=0.5)
    nan = Comparison("v", (2, 2), step=1, bitwise=False, passed=False, max_abs_diff=float("nan"))
    for order in ([big, nan], [nan, big]):
        assert "worst v step 1 rank 0: max|diff| nan" in classify(_outcome(), order).detail, order


def test_classifier_reads_each_ranks_own_collective_from_the_detail_wrapper():
    def msg(me, seq, op, shape, peer):
        return (
            f"RuntimeError: Detected mismatch between collectives on ranks. Rank {me} is running collective: "
            f"CollectiveFingerPrint(SequenceNumber={seq}, OpType={op}, TensorShape=[{shape}], TensorDtypes=Float), "
            f"but Rank {peer} is running collective: CollectiveFingerPrint(SequenceNumber=0OpType=GATHER)."
        )

    failure = RankFailure(
        "error", 1, msg(1, 7, "_REDUCE_SCATTER_BASE", 256, 0), stacks={0: msg(0, 7, "_ALLGATHER_BASE", 128, 1)}
    )
    verdict = classify(_outcome(failure), [])
    assert verdict.outcome == "collective mismatch"
    assert verdict.collectives == (
        {"rank": 1, "sequence": 7, "op": "_REDUCE_SCATTER_BASE", "shape": "256"},
        {"rank": 0, "sequence": 7, "op": "_ALLGATHER_BASE", "shape": "128"},
    )
    assert verdict.detail == "rank 1: #7 _REDUCE_SCATTER_BASE [256]; rank 0: #7 _ALLGATHER_BASE [128]"


def test_text_corpus_ships_with_python_and_splits_90_10():
    from harness.models.corpus import corpus, split

    assert len(corpus()) > 100_000
    train, held = split("train"), split("held_out")
    assert len(train) + len(held) == len(corpus()) and abs(len(held) / len(corpus()) - 0.1) < 1e-3
    assert int(train.max()) < 256


def test_transformer_loss_starts_near_eight_bits_per_byte():
    import math

    from harness.models.transformer import TransformerCase

    case = TransformerCase("x")
    bits = case.loss(case.build(), 0, 0, torch.device("cpu")).item() / math.log(2)
    assert 7.5 < bits < 9.0
