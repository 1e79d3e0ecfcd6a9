"""Claims about the owner-split plan: every matrix gets one owner, and each bucket, which
ends in an exchange every rank waits for, gives every owner the same work."""

from __future__ import annotations

from collections import Counter

import pytest

from distributed_impl.exchange import plan_buckets
from distributed_impl.placement import chunk_rows, row_spans

LAYER = [(4096, 4096)] * 4 + [(11008, 4096)] * 2 + [(4096, 11008)]


@pytest.mark.parametrize("shards", [2, 4])
def test_each_bucket_gives_every_owner_the_same_shapes_on_the_default_set(shards):
    shapes = LAYER * 32
    buckets = plan_buckets(shapes, shards, 1 << 26)
    assert sorted(it.index for b in buckets for it in b) == list(range(len(shapes)))
    for bucket in buckets:
        per_owner = [Counter((it.rows, it.cols) for it in bucket if it.owner == r) for r in range(shards)]
        assert all(c == per_owner[0] for c in per_owner), bucket


def test_row_spans_follow_torch_chunk_including_empty_shards():
    for rows in (0, 1, 3, 7, 8):
        spans = row_spans(rows, 4)
        assert [s.stop - s.start for s in spans] == chunk_rows(rows, 4)
        assert spans[0].start == 0 and spans[-1].stop == rows
