"""Claims about replaying a captured layout (``harness.replay``, ``--layout-from``): each rank's
piece is what FSDP2 and DTensor hold; a captured mesh replays as captured where the pool holds
it, and on a reduced mesh that keeps the pieces' sizes where it does not, saying what it kept;
what muongate cannot lay out as captured is named, never replayed otherwise; and the replay
gate judges the captured layout in a real session."""

from __future__ import annotations

import itertools
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import REPO, run_pytest

from gates.negative_controls import PastFirstBucketMuon
from harness.algorithms import MUON
from harness.capture import SCHEMA, VERSION, load_capture
from harness.cases import cases, layout_cases
from harness.layouts import FSDP, FSDP_TP
from harness.replay import local_shapes, parse_placement, replay
from harness.runner import RANK_PRELOAD

LLAMA = REPO / "examples" / "captures" / "llama-fsdp16.json"


def test_fsdp2_over_tp_pieces_are_what_fsdp2_holds_on_an_uneven_mesh() -> None:
    # Seen in a torchrun job on a (3, 2) mesh (dp, tp): ColwiseParallel, then fully_shard on dp,
    # of a [7, 4] weight. TP splits 7 rows into 4 and 3; FSDP2 splits each TP piece by torch.chunk.
    placements = [parse_placement("_StridedShard(dim=0, sf=2)"), parse_placement("Shard(dim=0)")]
    held = dict(local_shapes((7, 4), (3, 2), placements))
    seen = {(0, 0): 2, (1, 0): 2, (2, 0): 0, (0, 1): 1, (1, 1): 1, (2, 1): 1}
    assert {coord: local[0] for coord, local in held.items()} == seen


@given(
    mesh=st.lists(st.sampled_from([1, 2, 3, 4, 8]), min_size=1, max_size=3).map(tuple),
    shape=st.tuples(st.integers(0, 40), st.integers(0, 40)),
    data=st.data(),
)
@settings(max_examples=200, deadline=None)
def test_pieces_of_plain_shards_are_what_dtensor_computes(mesh: tuple[int, ...], shape: Any, data: Any) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    placements = [data.draw(st.sampled_from([Replicate(), Shard(0), Shard(1)])) for _ in mesh]
    ours = dict(local_shapes(shape, mesh, [parse_placement(repr(p)) for p in placements]))
    for coord in itertools.product(*(range(n) for n in mesh)):
        theirs, _ = _compute_local_shape_and_global_offset(shape, mesh, list(coord), placements)
        assert ours[coord] == tuple(theirs), (coord, placements)


def _pieces(size: int, parts: int) -> list[int]:
    """What ``torch.chunk`` gives each of ``parts`` ranks (none past the pieces it returns)."""
    chunks = [len(c) for c in torch.arange(size).chunk(parts)] if size else []
    return chunks + [0] * (parts - len(chunks))


def _fsdp_tp_capture(path: Path, dp: int, tp: int, params: dict[str, tuple[tuple[int, int], str]]) -> Path:
    """A capture written by hand of ``fully_shard`` on ``dp`` over ``parallelize_module`` on ``tp``:
    each weight colwise (TP splits rows, FSDP2 each TP piece's rows) or rowwise (TP splits
    columns, FSDP2 rows), every rank's piece from ``torch.chunk`` alone."""
    world = dp * tp
    entries = []
    for name, (shape, style) in params.items():
        ranks: list[dict[str, Any]] = [{}] * world
        for d, t in itertools.product(range(dp), range(tp)):
            if style == "colwise":
                local = [_pieces(_pieces(shape[0], tp)[t], dp)[d], shape[1]]
            else:
                local = [_pieces(shape[0], dp)[d], _pieces(shape[1], tp)[t]]
            ranks[d * tp + t] = {"local_shape": local, "offset": [0, 0]}
        strided = f"_StridedShard(dim=0, sf={tp})"
        placements = [strided, "Shard(dim=0)"] if style == "colwise" else ["Shard(dim=0)", "Shard(dim=1)"]
        mesh = {"shape": [dp, tp], "dim_names": ["dp", "tp"], "ranks": torch.arange(world).view(dp, tp).tolist()}
        entries.append({
            "name": name, "shape": list(shape), "dtype": "bfloat16", "group": 0, "algorithm": "muon",
            "settings": {"lr": 0.01, "ns_dtype": "torch.float32"},
            "layout": {"mesh": mesh, "placements": placements, "ranks": ranks},
        })  # fmt: skip
    data = {"schema": SCHEMA, "version": VERSION, "job": {"world_size": world, "backend": "nccl"}, "params": entries}
    path.write_text(json.dumps(data))
    return path


#: a Llama-ish block at 64 ranks, FSDP2 8 × TP 8: GQA keys of 2 heads, an odd hidden size
LLAMA_64 = {
    "layers.0.attention.wq.weight": ((1024, 1024), "colwise"),
    "layers.0.attention.wk.weight": ((128, 1024), "colwise"),
    "layers.0.attention.wo.weight": ((1024, 1024), "rowwise"),
    "layers.0.feed_forward.w1.weight": ((2731, 1024), "colwise"),
    "layers.0.feed_forward.w2.weight": ((1024, 2731), "rowwise"),
}


def test_a_64_rank_fsdp_tp_capture_replays_on_four_ranks_keeping_its_pieces(tmp_path: Path) -> None:
    capture = load_capture(_fsdp_tp_capture(tmp_path / "llama-64.json", 8, 8, LLAMA_64))
    replayed = replay(capture, nproc=4, algorithm=MUON)
    (only,) = replayed.meshes
    case = only.case
    assert case.layout is FSDP_TP and case.mesh == (2, 2) and case.tp == 2 and replayed.grids == ((2, 2),)
    assert dict(only.fixed) == {"lr": 0.01, "ns_dtype": "float32"}, "the file's settings, dtype by name"
    shapes = {p.name: (p.shape, p.style, p.dtype) for p in case.params}
    assert shapes["layers_0_attention_wk_weight"] == ((8, 1024), "colwise", "bfloat16"), "2 rows a piece, as at 64"
    for spec in case.params:
        captured = next(p for p in capture.params if p["name"].replace(".", "_") == spec.name)
        held = {tuple(r["local_shape"]) for r in captured["layout"]["ranks"]}
        placements = [parse_placement(t) for t in captured["layout"]["placements"]]
        placements = [("strided", 0, 2) if p[0] == "strided" else p for p in placements]  # tp is 2 now
        now = {local for _, local in local_shapes(spec.shape, case.mesh, placements)}
        kept = [line for line in replayed.lines if line.startswith(captured["name"])]
        assert now <= held or any("not kept" in line for line in kept), (spec, now, held)
        assert kept, f"the report says what {captured['name']} kept"
    hidden = [line for line in replayed.lines if line.startswith("layers.0.feed_forward.w1.weight")]
    # 2731 rows: TP pieces of 342 and 337, FSDP2 pieces of 43 and 41 (of 342), 43 and 36 (of 337);
    # two ranks of each cannot split a piece into 43 and less: the full chunk is what stays
    assert hidden == ["layers.0.feed_forward.w1.weight: dim 0 2731 → 172: pieces of 43 kept; 41, 36 not kept"]
    assert "2 ranks" not in " ".join(replayed.lines)

    on_two = replay(capture, nproc=2, algorithm=MUON)
    assert not on_two.meshes
    assert "mesh [8, 8]: not replayed: a split on each of its dims needs --nproc 4 or more" in on_two.lines


def test_what_muongate_cannot_lay_out_as_captured_is_named_not_replayed_otherwise(tmp_path: Path) -> None:
    path = _fsdp_tp_capture(tmp_path / "odd.json", 2, 2, {"w": ((8, 4), "colwise"), "v": ((6, 6), "rowwise")})
    data = json.loads(path.read_text())
    data["params"][1]["layout"]["placements"] = ["Shard(dim=1)", "Shard(dim=0)"]
    data["params"].append({**data["params"][0], "name": "h", "dtype": "float16"})
    data["params"].append(
        {**data["params"][0], "name": "plain", "layout": {"ranks": data["params"][0]["layout"]["ranks"]}}
    )
    data["params"][0]["layout"]["ranks"][3] = {"local_shape": [1, 4]}
    path.write_text(json.dumps(data))
    lines = replay(load_capture(path), nproc=4, algorithm=MUON).lines
    assert (
        "w: not replayed: rank 3 holds [1, 4], where (_StridedShard(dim=0, sf=2), Shard(dim=0)) gives [2, 4]" in lines
    )
    assert "v: not replayed: fsdp×tp does not lay out a 2-D parameter as (Shard(dim=1), Shard(dim=0))" in lines
    assert "h: not replayed: dtype float16; the gates run float32 and bfloat16" in lines
    assert any(line.startswith("plain: not replayed: a plain tensor on every rank") for line in lines)


def test_a_16_rank_fsdp2_capture_replays_on_two_ranks_with_its_pieces() -> None:
    replayed = replay(load_capture(LLAMA), nproc=2, algorithm=MUON)
    (only,) = replayed.meshes
    assert only.case.layout is FSDP and only.case.mesh == (2,)
    shapes = {p.name: p.shape for p in only.case.params}
    assert shapes["layers_0_wq_weight"] == (64, 512), "32 rows a rank, as at 16 ranks"
    assert shapes["layers_0_w1_weight"] == (172, 512) and shapes["embed_weight"] == (4002, 512)
    assert "embed.weight: dim 0 32003 → 4002: pieces of 2001 kept; 1988 not kept" in replayed.lines
    assert not any(p.use_muon for p in only.case.params if p.name.startswith(("embed", "output", "norm")))


def test_a_two_optimizer_capture_replays_its_adamw_half_as_adamw(pool: Any, tmp_path: Path) -> None:
    """Muon's matrices and torch.optim.AdamW's embedding and norm, captured into one file: each
    parameter replays under the algorithm that stepped it (the embedding is a matrix, stepped by
    AdamW), with each optimizer's own settings (AdamW's lr as the reference's ``adamw_lr``)."""
    from harness.tasks import selftest as selftest_tasks

    path = tmp_path / "two.json"
    ran = pool.run(selftest_tasks.two_optimizer_capture, str(path), world_size=2)
    assert ran.ok, ran.failure.describe()
    capture = load_capture(path)
    assert {p["name"]: p["algorithm"] for p in capture.params} == {
        "1.weight": "muon", "0.weight": "AdamW", "2.weight": "AdamW", "2.bias": "AdamW",
    }  # fmt: skip
    assert "distributed_impl.muon.ShardedMuon, torch.optim.adamw.AdamW" in capture.job["optimizer"]
    (only,) = replay(capture, nproc=2, algorithm=MUON).meshes
    assert {p.name: p.use_muon for p in only.case.params} == {
        "p1_weight": True, "p0_weight": False, "p2_weight": False, "p2_bias": False,
    }  # fmt: skip
    fixed = dict(only.fixed)
    assert (fixed["lr"], fixed["adamw_lr"], fixed["adamw_weight_decay"]) == (0.05, 0.003, 0.0), fixed


def test_an_optimizer_the_reference_does_not_emulate_is_not_replayed_and_is_in_the_ledger(tmp_path: Path) -> None:
    """A group ``torch.optim.SGD`` steps is neither of Muon's sides: named, not stepped as Muon."""
    path = _fsdp_tp_capture(tmp_path / "sgd.json", 2, 2, {"w": ((8, 4), "colwise"), "v": ((6, 6), "rowwise")})
    data = json.loads(path.read_text())
    data["params"][1]["algorithm"] = "SGD"
    data["params"][0]["algorithm"] = "AdamW"
    path.write_text(json.dumps(data))
    replayed = replay(load_capture(path), nproc=4, algorithm=MUON)
    (only,) = replayed.meshes
    assert [(p.name, p.use_muon) for p in only.case.params] == [("w", False)]
    assert "v: not replayed: stepped by SGD, which reference.Muon does not step" in replayed.lines
    assert [(u.part, u.asked) for u in replayed.unjudged] == [("parameter v", True)]


def test_a_mesh_too_large_for_the_pool_leaves_each_of_its_parameters_in_the_ledger(tmp_path: Path) -> None:
    capture = load_capture(_fsdp_tp_capture(tmp_path / "llama-64.json", 8, 8, LLAMA_64))
    dropped = replay(capture, nproc=2, algorithm=MUON).unjudged
    assert {u.part for u in dropped} == {f"parameter {name}" for name in LLAMA_64}
    assert {u.reason for u in dropped} == {"mesh [8, 8]: a split on each of its dims needs --nproc 4 or more"}


@given(
    case=st.one_of(
        cases(max_world=8, max_params=3, max_steps=1, algorithm=MUON),
        layout_cases(max_world=8, max_params=3, algorithm=MUON),
    )
)
@settings(max_examples=300, deadline=None)
def test_no_drawn_case_fills_the_bucket_the_planted_replay_bug_needs(case: Any) -> None:
    """The replay gate's control (``PastFirstBucketMuon``) shows only past one bucket on a rank;
    the drawn gates' largest cases stay inside it, so that only a captured layout shows it."""
    assert sum(math.prod(p.shape) for p in case.params) < PastFirstBucketMuon.BUCKET, case.describe()


@pytest.mark.slow
def test_a_session_replays_a_captured_layout_and_its_report_says_what_it_kept(pytester: pytest.Pytester) -> None:
    """On the ``dev`` profile: what is claimed is the report's, and each replayed case steps the
    capture's real sizes in bf16 Newton–Schulz, which a CPU without native bf16 products runs
    about 24 times slower than float32 (an AVX2 AMD EPYC, 2026-12-08: the ``ci`` profile's 200
    cases a gate passed 600 s before the routing gate ended)."""
    pytester.makeconftest("pytest_plugins = ['harness.plugin']")
    result = run_pytest(
        pytester, "--pyargs", "gates.test_replay_gates", "--nproc", "2", f"--layout-from={LLAMA}",
        "--hypothesis-profile", "dev", "--gate-report=report", "-p", "no:cacheprovider", timeout=600,
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()[-3000:]
    markdown = (pytester.path / "report" / "equivalence.md").read_text()
    assert f"replaying the layout of {LLAMA}" in markdown
    assert "mesh [16] (fsdp) of 16 ranks: on mesh [2], 2 ranks" in markdown
    assert "| replay | candidate | bitwise |" in markdown, "the candidate judged, bit for bit, on the replay"
    assert "| replay:clip:torch | torch: clipping |" in markdown, "torch's clip judged on the replay"
    assert "## Routing" in markdown and "layers_0_wq_weight[64, 512] | Muon | Muon | ok |" in markdown
    result.stdout.fnmatch_lines(["*replay:PastFirstBucketMuon*yes*", "routing audit · replay:routing: *as declared*"])


@pytest.mark.slow
def test_a_replay_that_drops_a_captured_mesh_is_not_green(pytester: pytest.Pytester) -> None:
    """A dp 2 × tp 2 job with a norm vector on a 1-D mesh, replayed at ``--nproc 2``: the norm
    replays, its 2-D mesh (every matrix) cannot, and the session exits 1 naming what it left out,
    one line per reason, unless ``--allow-unjudged`` (which still names it)."""
    path = _fsdp_tp_capture(pytester.path / "job.json", 2, 2, {"w": ((8, 4), "colwise"), "v": ((6, 6), "rowwise")})
    data = json.loads(path.read_text())
    pieces = [{"local_shape": [n], "offset": [0]} for n in (2, 2, 2, 0)]
    mesh = {"shape": [4], "dim_names": ["dp"], "ranks": [0, 1, 2, 3]}
    layout = {"mesh": mesh, "placements": ["Shard(dim=0)"], "ranks": pieces}
    data["params"].append({**data["params"][0], "name": "norm", "shape": [6], "layout": layout, "algorithm": "adamw"})
    path.write_text(json.dumps(data))
    pytester.makeconftest("pytest_plugins = ['harness.plugin']")
    args = ("--pyargs", "gates.test_replay_gates", "--nproc", "2", f"--layout-from={path}", "-p", "no:cacheprovider")
    args += ("--hypothesis-profile", "dev", "-k", "matches_reference", "--gate-report=report")
    red = run_pytest(pytester, *args, timeout=300)
    assert red.ret == 1, red.stdout.str()[-3000:]
    red.stdout.fnmatch_lines(
        [
            "1 gate: 1 bitwise, 0 within causes, 0 not judged, 0 differ; 2 named part(s) not judged",
            "NOT JUDGED: 2 named part(s) not judged: mesh [[]2, 2]: a split on each of its dims needs --nproc 4 or"
            " more: parameter w, parameter v",
            "muongate: NOT JUDGED: 2 part(s) of what you named were not judged*--allow-unjudged accepts that",
            "*1 passed*",
        ]
    )
    assert "## Not judged" in (pytester.path / "report" / "equivalence.md").read_text()
    allowed = run_pytest(pytester, *args, "--allow-unjudged", timeout=300)
    assert allowed.ret == 0, allowed.stdout.str()[-3000:]
    allowed.stdout.fnmatch_lines(["NOT JUDGED: 2 named part(s) not judged: *", "*(--allow-unjudged)"])


def _round_trip(pool: Any, case: Any) -> None:
    """The case built by the gates' own builders, captured, replays as that case."""
    from harness.tasks import selftest as selftest_tasks

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "layout.json")
        ran = pool.run(selftest_tasks.layout_capture, (case, str(path)), world_size=case.world_size)
        assert ran.ok, ran.failure.describe()
        replayed = replay(load_capture(path), nproc=pool.nproc, algorithm=MUON)
    (only,) = replayed.meshes
    assert (only.case.layout, only.case.mesh, only.case.tp, only.case.ep) == (case.layout, case.mesh, case.tp, case.ep)
    theirs = {p.name.removesuffix("_weight"): (p.shape, p.dtype, p.use_muon) for p in only.case.params}
    assert theirs == {p.name: (p.shape, p.dtype, p.use_muon) for p in case.params}, replayed.lines
    if case.tp > 1:
        styles = {p.name.removesuffix("_weight"): p.style for p in only.case.params if len(p.shape) == 2}
        assert styles == {p.name: p.style for p in case.params if len(p.shape) == 2}


@pytest.fixture(scope="module")
def pool() -> Any:
    from harness.ranks import RankPool

    with RankPool(4, preload=RANK_PRELOAD) as ranks:
        yield ranks


@pytest.fixture(scope="module")
def pool8() -> Any:
    from harness.ranks import RankPool

    with RankPool(8, preload=RANK_PRELOAD) as ranks:
        yield ranks


@given(case=layout_cases(max_world=4, min_world=1, max_params=3, algorithm=MUON))
@settings(max_examples=30, deadline=None)
def test_a_capture_of_muongates_own_layouts_replays_as_the_case_that_built_them(pool: Any, case: Any) -> None:
    """Round trip at 1 to 4 ranks, every family drawn there (FSDP2, TP, FSDP2 × TP, HSDP, EP)."""
    _round_trip(pool, case)


@pytest.mark.slow
@given(case=layout_cases(max_world=8, min_world=8, max_params=3, algorithm=MUON))
@settings(max_examples=30, deadline=None)
def test_a_capture_of_muongates_own_layouts_at_eight_ranks_replays_as_the_case_that_built_them(
    pool8: Any, case: Any
) -> None:
    """The same at 8 ranks: HSDP × TP on a 3-D mesh, and the 2-D families at 8."""
    _round_trip(pool8, case)
