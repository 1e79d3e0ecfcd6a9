"""Claims about the layout cases: they are built the way users build them (the placements
``parallelize_module`` and ``fully_shard`` give), the layout gate and its negative controls
hold at four ranks, and a candidate that does not declare a layout gets its cases narrowed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support import REPO, run_pytest, run_python

import reference
from harness.candidates import Impl
from harness.cases import Case, ParamSpec
from harness.layouts import EP_EFSDP, FSDP, FSDP_TP, HSDP, HSDP_TP, TP, Layout
from harness.ranks import RankPool
from harness.runner import RANK_PRELOAD
from harness.tasks import selftest as selftest_tasks


def _case(world: int, mesh: tuple[int, ...], layout: Layout) -> Case:
    return Case(
        params=(
            ParamSpec("col", (7, 5), style="colwise"),
            ParamSpec("row", (6, 3), style="rowwise"),
            ParamSpec("rep", (4, 4), style="replicate"),
        ),
        world_size=world,
        mesh=mesh,
        layout=layout,
        reference=reference.Muon,
    )


def test_layout_cases_get_the_placements_parallelize_module_and_fully_shard_give() -> None:
    with RankPool(4, preload=RANK_PRELOAD) as pool:
        pure = pool.run(selftest_tasks.layout_placements, _case(2, (2,), TP), world_size=2)
        both = pool.run(selftest_tasks.layout_placements, _case(4, (2, 2), FSDP_TP), world_size=4)
    assert pure.ok and both.ok, (pure.failure or both.failure).describe()  # type: ignore[union-attr]
    assert pure.results[0] == {"col": "(Shard(dim=0),)", "row": "(Shard(dim=1),)", "rep": "(Replicate(),)"}
    assert both.results[0] == {
        "col": "(_StridedShard(dim=0, sf=2), Shard(dim=0))",
        "row": "(Shard(dim=0), Shard(dim=1))",
        "rep": "(Shard(dim=0), Replicate())",
    }


def test_hsdp_over_tp_on_a_3d_mesh_gets_the_placements_fully_shard_gives() -> None:
    with RankPool(8, preload=RANK_PRELOAD) as pool:
        grid = pool.run(selftest_tasks.layout_placements, _case(8, (2, 2, 2), HSDP_TP), world_size=8)
    assert grid.ok, grid.failure.describe()  # type: ignore[union-attr]
    assert grid.results[5] == {
        "col": "(Replicate(), _StridedShard(dim=0, sf=2), Shard(dim=0))",
        "row": "(Replicate(), Shard(dim=0), Shard(dim=1))",
        "rep": "(Replicate(), Shard(dim=0), Replicate())",
    }


@pytest.mark.parametrize(
    "params, world, mesh, layout",
    [
        ((ParamSpec("w", (8, 6)),) * 8, 4, (4,), FSDP),
        ((ParamSpec("w", (8, 6)),) * 8, 4, (2, 2), HSDP),  # two copies of the rows
        (tuple(ParamSpec(f"w{i}", (8, 6), style="rowwise") for i in range(8)), 4, (4,), TP),  # Shard(1)
        (tuple(ParamSpec(f"w{i}", (8, 6), style=s) for i, s in enumerate(["colwise", "rowwise", "replicate"] * 3)), 4, (2, 2), FSDP_TP),
        ((ParamSpec("e", (8, 6, 4)),), 4, (2, 2), EP_EFSDP),  # expert stacks on (ep, efsdp)
        (tuple(ParamSpec(f"w{i}", (8, 6), style=s) for i, s in enumerate(["colwise", "rowwise", "replicate"] * 3)), 8, (2, 2, 2), HSDP_TP),
    ],
    ids=["fsdp", "hsdp", "tp-rowwise", "fsdp×tp", "ep×efsdp", "hsdp×tp"],
)  # fmt: skip
def test_owner_split_orthogonalizes_each_matrix_once_on_the_whole_mesh(params, world, mesh, layout) -> None:
    case = Case(
        params=tuple(p._replace(name=f"w{i}") for i, p in enumerate(params)),
        world_size=world,
        mesh=mesh,
        layout=layout,
        reference=reference.Muon,
    )
    with RankPool(world, preload=RANK_PRELOAD) as pool:
        outcome = pool.run(selftest_tasks.owner_split_work, case, world_size=world)
    assert outcome.ok, outcome.failure.describe()  # type: ignore[union-attr]
    matrices = sum(p.shape[0] if len(p.shape) == 3 else 1 for p in case.params)
    assert sum(outcome.results) == matrices, outcome.results
    assert max(outcome.results) - min(outcome.results) <= 1, outcome.results


def test_a_candidate_without_declared_layouts_gets_fsdp_cases_with_the_narrowing_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "flat_muon.py").write_text(
        "from harness.candidates import Candidate\n"
        "def flat_muon(param_groups, **settings):\n    raise AssertionError('never built')\n"
        "@Candidate(layouts={'tp'})\n"
        "def tp_muon(param_groups, **settings):\n    raise AssertionError('never built')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    flat = Impl.load("flat_muon:flat_muon").adapt(_case(4, (2, 2), FSDP_TP))
    assert (flat.layout, flat.tp, flat.mesh) == (FSDP, 1, (4,))
    assert any("fsdp×tp → FSDP2 alone (fsdp_tp not in its declared layouts" in note for note in flat.narrowed), (
        flat.narrowed
    )
    tp = Impl.load("flat_muon:tp_muon")
    assert tp.adapt(_case(2, (2,), TP)).tp == 2 and not tp.adapt(_case(2, (2,), TP)).narrowed
    assert tp.adapt(_case(4, (2, 2), FSDP_TP)).tp == 1


@pytest.mark.slow
def test_layout_resharding_and_twin_gates_and_their_negative_controls_hold_at_four_ranks(
    other_project: pytest.Pytester,
) -> None:
    result = run_pytest(
        other_project, "-p", "harness.plugin", "--pyargs", "gates.test_layout_gates", "gates.test_reshard_gates",
        "gates.test_training_gates", "-k", "(layout or reshard or twins) and not the_models", "--nproc", "4", "-p", "no:randomly",
        "--hypothesis-profile", "dev", "--hypothesis-seed", "0", timeout=600,
    )  # fmt: skip
    # -k matches the layout module's name, so all seven of its tests run (the Gram tier's too);
    # the 8-rank twins need --nproc 8, and the gram_partial tier of a candidate needs --impl; the
    # three mixed-precision twins (their names say twins) run too
    result.assert_outcomes(passed=18, skipped=2)
    result.stdout.fnmatch_lines_random(["*layouts:StridedOrderMuon*yes*w0[[]* · world 4 · mesh [[]2, 2] · tp 2*"])


@pytest.mark.slow
def test_the_fsdp2_over_tp_empty_piece_finding_still_reproduces_with_torch_alone() -> None:
    """The torch finding the layout cases steer around; when torch fixes it, this fails, and
    the widening in ``layout_cases`` can go."""
    script = REPO / "examples" / "findings" / "fsdp2_over_tp_empty_piece.py"
    run = run_python(
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "4",
        script,
        timeout=120,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert run.returncode != 0, run.stdout[-2000:]
    assert "local [0, 0] (expected [1, 0])" in run.stdout, run.stdout[-2000:]
