"""Claims about capturing a job's layout (``harness.capture``): taken inside a real torchrun job,
it holds each parameter's global shape, placements and every rank's piece, and nothing of the
weights; a file muongate cannot read is refused with one line naming it and what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import REPO, repo_env, run_python

from harness.algorithms import MUON
from harness.capture import SCHEMA, VERSION, CaptureError, load_capture
from harness.layouts import FSDP, FSDP_TP
from harness.replay import replay

JOB = REPO / "examples" / "capture_job.py"


def _captured(tmp_path: Path, nproc: int) -> Path:
    out = tmp_path / f"layout-{nproc}.json"
    run = run_python(
        "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), JOB, out,
        cwd=tmp_path, env=repo_env(tmp_path), timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return out


@pytest.mark.slow
def test_a_torchrun_job_captures_every_ranks_piece_and_no_weights(tmp_path: Path) -> None:
    two = load_capture(_captured(tmp_path, 2))
    assert two.job["world_size"] == 2 and two.job["backend"] == "gloo"
    by_name = {p["name"]: p for p in two.params}
    assert [p["name"] for p in two.params] == ["0.weight", "2.weight", "0.bias", "2.bias"], "the optimizer's order"
    second = by_name["2.weight"]
    assert second["shape"] == [3, 8] and second["algorithm"] == "muon" and by_name["2.bias"]["algorithm"] == "adamw"
    assert second["layout"]["placements"] == ["Shard(dim=0)"] and second["layout"]["chunks"] == [2]
    assert [r["local_shape"] for r in second["layout"]["ranks"]] == [[2, 8], [1, 8]], "uneven: 2 rows and 1"
    assert [r["offset"] for r in second["layout"]["ranks"]] == [[0, 0], [2, 0]]
    assert second["settings"]["lr"] == 0.02 and second["settings"]["ns_dtype"] == "torch.bfloat16"
    text = two.path.read_text()
    assert "tensor(" not in text and len(text) < 20_000, "no values of the weights"

    four = load_capture(_captured(tmp_path, 4))
    tp = {p["name"]: p["layout"] for p in four.params}
    assert tp["0.weight"]["mesh"]["dim_names"] == ["dp", "tp"]
    assert tp["0.weight"]["placements"] == ["_StridedShard(dim=0, sf=2)", "Shard(dim=0)"], "FSDP2 over TP's colwise"
    assert tp["2.weight"]["placements"] == ["Shard(dim=0)", "Shard(dim=1)"], "FSDP2 over TP's rowwise"
    assert sum(r["local_shape"][0] for r in tp["2.weight"]["ranks"]) == 2 * 3, "each row on the two tp ranks"

    # replayed as captured: the families and styles muongate's builders give exactly these pieces
    (fsdp,) = replay(two, nproc=2, algorithm=MUON).meshes
    assert fsdp.case.layout is FSDP and [p.shape for p in fsdp.case.params] == [(8, 10), (3, 8), (8,), (3,)]
    replayed = replay(four, nproc=4, algorithm=MUON)
    (both,) = replayed.meshes
    assert both.case.layout is FSDP_TP and both.case.mesh == (2, 2) and both.case.tp == 2
    assert [(p.name, p.style) for p in both.case.params] == [("p0_weight", "colwise"), ("p2_weight", "rowwise"),
                                                             ("p2_bias", "colwise")]  # fmt: skip
    assert any(line.startswith("0.bias: not replayed: fsdp×tp does not lay out a 1-D") for line in replayed.lines)


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "layout.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


GOOD = {
    "schema": SCHEMA,
    "version": VERSION,
    "job": {"world_size": 2},
    "params": [
        {"name": "w", "shape": [3, 4], "dtype": "float32", "group": 0, "algorithm": "muon",
         "layout": {"ranks": [{"local_shape": [2, 4]}, {"local_shape": [1, 4]}]}},
    ],
}  # fmt: skip


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ("{not json", "not JSON"),
        ({**GOOD, "schema": "other"}, "not a muongate capture"),
        ({**GOOD, "version": VERSION + 1}, f"capture version {VERSION + 1}; this muongate reads version {VERSION}"),
        ({**GOOD, "job": {}}, "no world_size"),
        ({**GOOD, "params": [{"name": "w"}]}, "params[0] ('w'): lacks shape, dtype, group, algorithm, layout"),
        (
            {**GOOD, "job": {"world_size": 3}},
            "params[0] ('w'): its layout does not give each of the 3 ranks' local shape",
        ),
    ],
)
def test_a_file_muongate_cannot_read_is_refused_in_one_line_naming_it(tmp_path: Path, data: object, said: str) -> None:
    path = _write(tmp_path, data)
    with pytest.raises(CaptureError) as refused:
        load_capture(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: ") and said in message and "\n" not in message, message


def test_the_command_checks_a_file_and_says_what_it_holds(tmp_path: Path) -> None:
    good = _write(tmp_path, GOOD)
    run = run_python("-m", "harness.capture", good, env=repo_env(tmp_path), timeout=60)
    assert run.returncode == 0 and "1 parameter of a 2-rank job" in run.stdout, run.stdout + run.stderr
    missing = run_python("-m", "harness.capture", tmp_path / "none.json", env=repo_env(tmp_path), timeout=60)
    assert missing.returncode == 1 and "none.json: cannot be read" in missing.stderr, missing.stderr
