"""Claims about the case generators: bad bounds fail at once with the values named, cases
pickle (they travel to the ranks), and shrinking heads for the simplest case."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

from harness.algorithms import MUON
from harness.cases import Case, Clip, ParamSpec, cases, clip_cases, matrix_shapes, row_block_cases, settings_of
from harness.cases.strategies import TILES, tile_shapes
from harness.layouts import EP_EFSDP, HSDP


@pytest.mark.parametrize(
    ("strategy", "message"),
    [
        (lambda: matrix_shapes(min_side=5, max_side=3), "min_side=5 is larger than max_side=3"),
        (lambda: matrix_shapes(min_side=0), "min_side=0 must be at least 1"),
        (lambda: cases(max_world=0, algorithm=MUON), "max_world=0 must be at least 1"),
        (lambda: cases(max_params=0, algorithm=MUON), "max_params=0 must be at least 1"),
        (lambda: cases(max_steps=0, algorithm=MUON), "max_steps=0 must be at least 1"),
    ],
)
def test_bad_strategy_arguments_raise_naming_the_values(strategy, message):
    with pytest.raises(ValueError, match=message):
        find(strategy(), lambda _: True)


@given(case=cases(max_world=4, hsdp=True, checkpoint=True, algorithm=MUON))
@settings(max_examples=50)
def test_cases_pickle_and_respect_their_bounds(case: Case):
    assert pickle.loads(pickle.dumps(case)) == case
    assert 1 <= case.world_size <= 4 and 1 <= case.steps <= 5
    assert case.mesh in ((case.world_size,), (2, case.world_size // 2))
    for p in case.params:
        assert min(p.shape) >= 1
        if max(p.shape) > 48:  # only a tile shape (tile_shapes): on some split, a piece one past a tile
            rows, cols = p.shape[-2:]
            splits = range(1, case.world_size + 1)
            assert any(-(-rows // w) - 1 in TILES or -(-cols // w) - 1 in TILES for w in splits), p


@given(world=st.integers(1, 8), data=st.data())
def test_tile_shapes_give_every_rank_but_the_last_a_piece_one_past_a_tile(world: int, data: st.DataObject) -> None:
    rows, cols = data.draw(tile_shapes(world))
    assert -(-rows // world) - 1 in TILES or -(-cols // world) - 1 in TILES, (rows, cols)
    assert rows * cols <= 18_000, "the whole matrix stays small enough for the bucket the replay's control needs"


@pytest.mark.parametrize("tile", TILES)
def test_tile_shapes_cross_each_tile_in_rows_and_in_columns(tile: int) -> None:
    find(tile_shapes(2), lambda rc: -(-rc[0] // 2) == tile + 1)
    find(tile_shapes(2), lambda rc: -(-rc[1] // 2) == tile + 1)


def test_cases_shrink_to_one_rank_one_small_square_fp32_matrix_one_step():
    simplest = find(cases(max_world=4, algorithm=MUON), lambda _: True)
    assert simplest.world_size == 1 and simplest.steps == 1
    assert simplest.params == (ParamSpec("w0", (4, 4), "float32"),)
    assert dict(simplest.settings) == dict(find(settings_of(MUON), lambda _: True))


def test_settings_shrink_to_the_defaults():
    defaults = dict(find(settings_of(MUON), lambda _: True))
    assert defaults == {
        "lr": 0.02, "momentum": 0.95, "nesterov": True, "weight_decay": 0.0, "ns_steps": 5,
        "momentum_form": "ema", "ns_coefficients": "keller", "eps_form": "add", "ns_dtype": "bfloat16",
        "adjust_lr_fn": "original",
    }  # fmt: skip


@given(shape=matrix_shapes(world_size=3, experts=True))
def test_matrix_shapes_are_2d_or_expert_stacks(shape):
    assert len(shape) in (2, 3) and all(s >= 1 for s in shape)


def test_some_drawn_shapes_leave_a_rank_with_an_empty_shard():
    find(matrix_shapes(world_size=2), lambda s: s[0] < 2)
    find(st.tuples(matrix_shapes(world_size=3)), lambda t: t[0][0] % 3 != 0)


def test_clip_cases_shrink_to_fsdp2_on_one_rank_clipping_the_2_norm_to_one_with_nothing_tied():
    simplest = find(clip_cases(max_world=4, algorithm=MUON), lambda _: True)
    assert simplest.world_size == 1 and simplest.clip == Clip(1.0, 2.0, None)
    assert simplest.params == (ParamSpec("w0", (4, 4), "float32"),)


@pytest.mark.parametrize(
    "what",
    [
        lambda c: c.layout is EP_EFSDP and any(len(p.shape) == 3 for p in c.params),
        lambda c: c.layout is HSDP,
        lambda c: c.tp > 1 and any(p.style == "replicate" for p in c.params),
        lambda c: c.tp > 1 and any(not p.use_muon and len(p.shape) == 1 for p in c.params),
        lambda c: c.clip.tied is not None and c.clip.norm_type == float("inf"),
        lambda c: c.clip.norm_type == 1.0 and len({p.grad_scale for p in c.params}) > 1,
    ],
    ids=["experts", "hsdp", "tp-replicated matrix", "tp-replicated vector", "tied, inf-norm", "1-norm, scales"],
)
def test_clip_cases_draw_every_duplication_clipping_meets(what):
    find(clip_cases(max_world=4, algorithm=MUON), what, settings=settings(max_examples=2000))


def test_row_block_cases_draw_the_fused_projection_tensor_parallelism_lays_out() -> None:
    """Each TP rank's rows one whole group of unequal blocks (a fused QKV under GQA, as Megatron
    lays it out): the global split is that group repeated tp times."""

    def fused(case: Case) -> bool:
        split = tuple(dict(case.settings).get("ns_split", ()))
        group = split[: len(split) // case.tp] if case.tp > 1 else ()
        return len(set(group)) > 1 and split == group * case.tp

    find(row_block_cases(max_world=2), fused)
