"""Claims about ``python -m harness.train``: it trains on real ranks and keeps its curve."""

from __future__ import annotations

import json

from harness.train import main


def test_train_command_writes_the_loss_curve_after_every_chunk_and_a_report(tmp_path):
    assert main(["--steps", "4", "--chunk", "2", "--report", str(tmp_path)]) == 0
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    curves = [r for r in records if r["kind"] == "training"]
    assert [len(r["train_bits"]) for r in curves] == [2, 4]
    assert all(7 < b < 9 for b in curves[-1]["train_bits"]), "a byte model starts near 8 bits per byte"
    assert (tmp_path / "equivalence.html").read_text().count("<polyline") == 1
