"""The hypothesis strategies that draw cases (``harness.cases.case``).

Hypothesis runs in the pytest parent only; ranks receive concrete cases, so shrinking is
just more cases. Strategies shrink towards the simplest case: one rank, a small square float32 matrix,
one step, default settings.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Collection
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from hypothesis import strategies as st

from harness.algorithms import MUON
from harness.cases.case import Case, Clip, DType, GradKind, Mode, ParamSpec, QKClip, ReshardCase, Style, stored_setting
from harness.layouts import DRAWN, FSDP, Layout, fully_sharded

if TYPE_CHECKING:
    from harness.algorithms import Algorithm
    from harness.replay import Replay

Settings = tuple[tuple[str, Any], ...]


def _check_bounds(name_lo: str, lo: int, name_hi: str, hi: int) -> None:
    if lo < 1:
        raise ValueError(f"{name_lo}={lo} must be at least 1")
    if lo > hi:
        raise ValueError(f"{name_lo}={lo} is larger than {name_hi}={hi}")


#: the tile sizes kernels block by (16, 32, 64, 128): a matrix of ``tile_shapes`` gives each
#: rank a piece one past one of them, in rows or in columns
TILES = (16, 32, 64, 128)


def tile_shapes(world_size: int) -> st.SearchStrategy[tuple[int, int]]:
    """Matrices whose pieces on ``world_size`` ranks cross a tile boundary (``TILES``): split by
    rows, each rank but the last holds ``t + 1`` rows (``t`` a tile), or, split by columns (TP's
    row-wise style), ``t + 1`` columns, the other side small enough that the whole matrix stays
    under 18,000 elements at 8 ranks. A kernel that blocks by 16 to 128 and slips at a block's
    edge (leaves the rows past the first block unchanged, say) shows only on pieces that large;
    the drawn sides stay under 48, so ``matrix_shapes`` draws these too, now and then."""
    w = max(1, world_size)
    pairs = list(zip(TILES, reversed(TILES), strict=True))  # (16, 128), (32, 64), (64, 32), (128, 16)
    by_rows = [((t + 1) * w - (w > 1), o + 1) for t, o in pairs]
    by_cols = [(o + 1, (t + 1) * w - (w > 1)) for t, o in pairs]
    return st.sampled_from(by_rows + by_cols)


def matrix_shapes(
    *, min_side: int = 1, max_side: int = 48, world_size: int = 2, experts: bool = False, tiles: bool = True
) -> st.SearchStrategy[tuple[int, ...]]:
    """2-D shapes (square, tall, wide, 1 row, fewer rows than ranks, rows not divisible by
    the world size, prime sides) and, with ``experts``, 3-D ``[E, rows, cols]`` stacks; with
    ``tiles``, about one matrix in twelve whose pieces cross a kernel's tile (``tile_shapes``,
    past ``max_side``; never in a stack).

    Shrinks towards a small square matrix. Sub-strategies are built here, once: building
    them inside every draw made drawing a case several times slower.
    """
    _check_bounds("min_side", min_side, "max_side", max_side)
    sides = st.integers(min_side, max_side)
    special = st.sampled_from(
        [
            (4, 4),  # shrink target
            (1, max(min_side, min(7, max_side))),  # one row: every rank but one holds an empty shard
            (max(1, world_size - 1), max_side),  # fewer rows than ranks
            (world_size * 3 + 1, 5),  # rows not divisible by the world size
            (min(31, max_side), min(13, max_side)),  # primes, tall
            (min(13, max_side), min(31, max_side)),  # primes, wide
        ]
    )
    matrices = st.one_of(special, st.tuples(sides, sides)).map(
        lambda rc: (max(min_side, min(rc[0], max_side)), max(min_side, min(rc[1], max_side)))
    )
    drawn: st.SearchStrategy[tuple[int, ...]] = matrices
    if tiles:
        # one in twelve, shrinking to the drawn matrices (False first); a drawn matrix costs one
        # choice more than before and no tile shape, so that it still shrinks before a stack does
        tiled, big = st.sampled_from([False] * 11 + [True]), tile_shapes(world_size)

        @st.composite
        def draw_matrix(draw: st.DrawFn) -> tuple[int, ...]:
            return draw(big) if draw(tiled) else draw(matrices)

        drawn = draw_matrix()
    if not experts:
        return drawn
    stacks = st.tuples(st.integers(1, 2 * world_size + 1), matrices).map(lambda em: (em[0], *em[1]))
    return st.one_of(drawn, stacks)


@functools.cache
def settings_of(algorithm: Algorithm, *, conventions: bool = True) -> st.SearchStrategy[Settings]:
    """The hyperparameters (and, with ``conventions``, the convention settings) a reference
    declares in its ``SPACE`` and ``CONVENTIONS`` (``harness.algorithms``).

    Shrinks towards the defaults (each setting's first value). One strategy per reference,
    built once: strategies drawn inside a composite's draw may call this on every draw, and
    a new strategy is validated again each time."""

    fields = {name: _values(name, values) for name, values in algorithm.space.items()}
    if conventions:
        fields.update({name: _values(name, values) for name, values in algorithm.conventions.items()})
    return st.fixed_dictionaries(fields).map(lambda d: tuple(d.items()))


def _values(name: str, values: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    """One setting's values, the first the shrink target; an ``Interval`` is any float in it."""
    from reference import Interval

    if values == (True, False):
        return st.booleans().map(operator.not_)
    if values == (False, True):
        return st.booleans()
    plain = st.sampled_from([stored_setting(name, v) for v in values if not isinstance(v, Interval)])
    ranges = [st.floats(v.lo, v.hi, allow_subnormal=False) for v in values if isinstance(v, Interval)]
    return st.one_of(plain, *ranges) if ranges else plain


#: a parameter's gradients over the steps (``harness.cases.case.GradKind``), for every family alike
_GRAD_KINDS: st.SearchStrategy[GradKind] = st.sampled_from(["normal", "normal", "zero", "none", "every_other", "late"])
_GRAD_SCALES = st.sampled_from([1.0, 1e-3, 1e3, 1e-8])
_MODES: st.SearchStrategy[Mode] = st.sampled_from(["all_ranks", "owner_split"])
_SEEDS = st.integers(0, 2**31 - 1)


def cases(
    *,
    max_world: int = 2,
    max_params: int = 3,
    max_steps: int = 5,
    max_side: int = 48,
    dtypes: tuple[DType, ...] = ("float32", "bfloat16"),
    adamw: bool = True,
    experts: bool = True,
    hsdp: bool = False,
    checkpoint: bool = False,
    algorithm: Algorithm,
    thresholds: tuple[int, ...] = (),
) -> st.SearchStrategy[Case]:
    """Whole optimizer cases for ``algorithm`` (a family, ``harness.algorithms``): its settings, and
    parameters of the kinds it takes (``PARAM_NDIMS``; a hybrid one's AdamW groups, with
    ``adamw``, take vectors and matrices). Shrinks towards one rank, one small square fp32
    matrix (a vector for an algorithm that takes no matrix), one step. ``thresholds`` (a
    candidate's ``Candidate.thresholds``) adds tensors on both sides of each (``threshold_shapes``)."""

    for name, value in (("max_world", max_world), ("max_params", max_params), ("max_steps", max_steps)):
        if value < 1:
            raise ValueError(f"{name}={value} must be at least 1")
    worlds = st.integers(1, max_world)
    steps_drawn = st.integers(1, max_steps)
    dtype_drawn = st.sampled_from(dtypes)
    settings_drawn = settings_of(algorithm)
    if algorithm.hybrid:
        main_shapes = {
            w: matrix_shapes(max_side=max_side, world_size=w, experts=experts) for w in range(1, max_world + 1)
        }
    else:
        main_shapes = {w: _shapes(algorithm.ndims, max_side, w, experts) for w in range(1, max_world + 1)}
    if thresholds:
        main_shapes = {
            w: st.one_of(shapes, threshold_shapes(thresholds, max_world=max_world, ndims=algorithm.ndims))
            for w, shapes in main_shapes.items()
        }
    other_shapes = {
        w: st.one_of(st.tuples(st.integers(1, max_side)), matrix_shapes(max_side=max_side, world_size=w))
        for w in range(1, max_world + 1)
    }

    @st.composite
    def param_drawn(draw: st.DrawFn, shards: int, *, first: bool) -> ParamSpec:
        use_muon = first or not adamw or not algorithm.hybrid or draw(st.booleans())
        return ParamSpec(
            name="",
            shape=draw(main_shapes[shards] if use_muon else other_shapes[shards]),
            dtype=draw(dtype_drawn),
            use_muon=use_muon,
            grad="normal" if first else draw(_GRAD_KINDS),
            grad_scale=draw(_GRAD_SCALES),
        )

    # The first parameter has a gradient (and, for a hybrid reference, takes Muon); the others
    # are a list, so that shrinking can drop any of them, not only the last. Per count of shards.
    firsts = {w: param_drawn(w, first=True) for w in main_shapes}
    others = {w: st.lists(param_drawn(w, first=False), max_size=max_params - 1) for w in main_shapes}
    checkpoints = {steps: st.integers(1, steps - 1) for steps in range(2, max_steps + 1)}

    @st.composite
    def draw_case(draw: st.DrawFn) -> Case:
        world = draw(worlds)
        mesh: tuple[int, ...] = (world,)
        if hsdp and world >= 4 and world % 2 == 0 and draw(st.booleans()):
            mesh = (2, world // 2)
        shards = mesh[-1]
        params = [p._replace(name=f"w{i}") for i, p in enumerate([draw(firsts[shards]), *draw(others[shards])])]
        steps = draw(steps_drawn)
        return Case(
            params=tuple(params),
            seed=draw(_SEEDS),
            world_size=world,
            mesh=mesh,
            layout=fully_sharded(len(mesh)),
            steps=steps,
            mode=draw(_MODES) if algorithm.orthogonalizes else None,
            settings=draw(settings_drawn),
            checkpoint_after=draw(checkpoints[steps]) if checkpoint and steps > 1 else None,
            reference=algorithm.in_case,
        )

    return draw_case()


def threshold_shapes(
    thresholds: tuple[int, ...], *, max_world: int = 2, ndims: tuple[int, ...] = (1, 2)
) -> st.SearchStrategy[tuple[int, ...]]:
    """Tensors on both sides of each size ``T`` at which a candidate changes behaviour, whole and
    as shards: ``T·w`` elements give each of ``w`` ranks about ``T`` (FSDP2 splits dim 0), so for
    every world size up to ``max_world`` it draws vectors of ``T·w − 1``, ``T·w``, ``T·w + 1``
    elements and matrices of 64, 128 or 256 columns with a row fewer, as many, or one more than
    ``T·w`` needs. Shrinks towards ``T`` elements in one vector (or rows of 256)."""
    sizes = sorted({t * w for t in thresholds for w in range(1, max_world + 1)})
    kinds: list[st.SearchStrategy[tuple[int, ...]]] = []
    if 1 in ndims:
        kinds.append(st.tuples(st.sampled_from(sizes), st.sampled_from([0, -1, 1])).map(lambda nd: (nd[0] + nd[1],)))
    if 2 in ndims:
        matrices = st.tuples(st.sampled_from(sizes), st.sampled_from([256, 128, 64]), st.sampled_from([0, -1, 1]))
        kinds.append(matrices.map(lambda n: (max(1, n[0] // n[1] + n[2]), n[1])))
    if not kinds:
        raise ValueError(f"PARAM_NDIMS {ndims}: thresholds need vectors or matrices")
    return st.one_of(*kinds)


def session_cases(config: Any, **bounds: Any) -> st.SearchStrategy[Case]:
    """``cases(**bounds)`` for the running session (``harness.session.GateConfig``): its reference's
    settings and tensors, and its candidate's thresholds."""
    return cases(algorithm=config.algorithm, thresholds=config.thresholds, **bounds)


def _shapes(ndims: tuple[int, ...], max_side: int, world: int, experts: bool) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes of the kinds an algorithm takes that FSDP2 can shard (1-D to 3-D; 3-D only with
    ``experts``), matrices first where it takes them: a vector of any length (1, fewer than the
    ranks, not divisible by them), ``matrix_shapes`` and its stacks."""
    kinds: list[st.SearchStrategy[tuple[int, ...]]] = []
    if 2 in ndims or (3 in ndims and experts):
        kinds.append(matrix_shapes(max_side=max_side, world_size=world, experts=3 in ndims and experts))
    if 1 in ndims:
        kinds.append(st.tuples(st.one_of(st.sampled_from([4, 1, world * 3 + 1]), st.integers(1, max_side * 4))))
    if not kinds:
        raise ValueError(f"PARAM_NDIMS {ndims}: none of them is a shape FSDP2 can shard (1-D to 3-D)")
    return st.one_of(*kinds)


def norm_tie_cases(*, max_world: int = 2, max_params: int = 2, max_steps: int = 2) -> st.SearchStrategy[Case]:
    """Cases that reach bf16's blind spot: every gradient's Frobenius norm on a bf16 rounding
    tie (``harness.cases.tensors.norm_boundary_matrix``), zero momentum (so the update is the
    gradient and the tie reaches Newton–Schulz), and bf16 Newton–Schulz. A last-bit
    difference in a float32 norm then decides the bf16 norm in about a third of these
    cases, where on random gradients it almost never does."""
    drawn = cases(
        max_world=max_world, max_params=max_params, max_steps=max_steps, adamw=False, experts=False, algorithm=MUON
    )
    return drawn.map(_on_norm_ties)


def _on_norm_ties(case: Case) -> Case:
    params = tuple(p._replace(grad="norm_boundary") for p in case.params)
    settings = {**dict(case.settings), "momentum": 0.0, "ns_dtype": "bfloat16"}
    return replace(case, params=params, settings=tuple(settings.items()))


def _no_empty_chunk(n: int, parts: int) -> int:
    """The smallest size from ``n`` up that ``torch.chunk`` splits into ``parts`` non-empty pieces."""
    while n < parts or -(-n // parts) * (parts - 1) >= n:
        n += 1
    return n


_STYLES: st.SearchStrategy[Style] = st.sampled_from(["colwise", "rowwise", "replicate"])


def _layouts(world: int) -> list[tuple[Layout, tuple[int, ...]]]:
    """Every layout family drawn on ``world`` ranks with its mesh there, in the order they
    shrink through (``harness.layouts.DRAWN``): FSDP2 on a 1-D mesh first, then pure TP."""
    return [(layout, mesh) for layout in DRAWN if (mesh := layout.mesh(world)) is not None]


def _split(tp: int, mesh: tuple[int, ...]) -> int:
    """How many pieces a layout cuts a matrix into: its TP degree, else its last mesh dim's ranks."""
    return mesh[-1] if tp == 1 else tp


def _buildable(shape: tuple[int, ...], style: Style, tp: int, world: int) -> tuple[int, ...]:
    """``shape``, widened where FSDP2 over TP would leave a row-wise piece with no columns: it
    gives that piece a [0, 0] local tensor DTensor cannot gather, a torch finding
    (examples/findings/fsdp2_over_tp_empty_piece.py)."""
    if style == "rowwise" and 1 < tp < world:
        return (*shape[:-1], _no_empty_chunk(shape[-1], tp))
    return shape


def layout_cases(
    *,
    max_world: int = 2,
    min_world: int = 2,
    max_params: int = 3,
    max_steps: int = 3,
    algorithm: Algorithm,
    families: Collection[Layout] | None = None,
) -> st.SearchStrategy[Case]:
    """Cases laid out as users lay out tensor parallelism: ``tp`` ranks of ``parallelize_module``
    (each matrix ``ColwiseParallel``, ``RowwiseParallel`` or replicated) alone on a 1-D mesh,
    or, with four ranks or more, under ``fully_shard`` on a ``dp`` dim of 2 (FSDP2 × TP, which
    gives ``_StridedShard``). Shapes are drawn for the TP split, so rows or columns are often
    not divisible by it, and some ranks hold empty pieces. With four ranks or more it also
    draws HSDP, and expert parallelism (``ep`` 2: 3-D stacks split over ``ep`` by experts
    and over ``efsdp`` by rows); with eight, HSDP × TP on a 3-D mesh. Each family is drawn as
    often as the others, then a world size it runs on. Shrinks towards today's layout: pure
    TP on ``min_world`` ranks, colwise, which is ``(Shard(0),)`` on a 1-D mesh (on one rank:
    FSDP2 alone). ``algorithm`` gives the settings drawn;
    ``families`` draws those layout families only (a negative control aimed at one)."""

    _check_bounds("min_world", min_world, "max_world", max_world)
    settings_drawn = settings_of(algorithm)

    # the family first, then a world size it runs on: every family as often as the others
    drawn_families: dict[Layout, list[tuple[int, tuple[int, ...]]]] = {}
    for w in range(min_world, max_world + 1):
        options = _layouts(w)
        for family, mesh in options[1:] or options:  # FSDP2 alone only on one rank
            drawn_families.setdefault(family, []).append((w, mesh))
    if families is not None:
        drawn_families = {f: w for f, w in drawn_families.items() if f in families}
        if not drawn_families:
            raise ValueError(
                f"families={sorted(f.name for f in families)}: none is drawn on {min_world}..{max_world} ranks"
            )

    family_drawn = st.sampled_from(list(drawn_families))
    layouts_drawn = {family: st.sampled_from(worlds) for family, worlds in drawn_families.items()}
    # shapes by the count a matrix is split into and whether experts are stacked
    shapes: dict[tuple[int, bool], st.SearchStrategy[tuple[int, ...]]] = {}
    for family, worlds in drawn_families.items():
        for _, mesh in worlds:
            tp, ep = family.degrees_on(mesh)
            split = _split(tp, mesh)
            shapes[split, ep > 1] = matrix_shapes(max_side=24, world_size=split, experts=ep > 1)
    count_drawn, steps_drawn = st.integers(1, max_params), st.integers(1, max_steps)
    dtype_drawn: st.SearchStrategy[DType] = st.sampled_from(["float32", "bfloat16"])

    @st.composite
    def draw_case(draw: st.DrawFn) -> Case:
        family = draw(family_drawn)
        world, mesh = draw(layouts_drawn[family])
        tp, ep = family.degrees_on(mesh)
        shapes_drawn = shapes[_split(tp, mesh), ep > 1]
        params = []
        for i in range(draw(count_drawn)):
            shape, style = draw(shapes_drawn), draw(_STYLES)
            shape = _buildable(shape, style, tp, world)
            dtype = draw(dtype_drawn)
            params.append(ParamSpec(f"w{i}", shape, dtype, grad=draw(_GRAD_KINDS) if i else "normal", style=style))
        return Case(
            params=tuple(params),
            seed=draw(_SEEDS),
            world_size=world,
            mesh=mesh,
            steps=draw(steps_drawn),
            mode=draw(_MODES) if algorithm.orthogonalizes else None,
            settings=draw(settings_drawn),
            layout=family,
            reference=algorithm.in_case,
        )

    return draw_case()


def every_layout(
    *,
    max_world: int,
    max_params: int,
    max_steps: int,
    hsdp: bool = False,
    algorithm: Algorithm,
    families: Collection[Layout] | None = None,
) -> st.SearchStrategy[Case]:
    """FSDP2 on 1 to ``max_world`` ranks (``cases``; with ``hsdp``, HSDP too) and every family
    ``layout_cases`` draws: the base of a claim that holds on every layout. ``families``: those
    of ``layout_cases`` only (a negative control aimed at one). Shrinks towards ``cases``."""
    laid_out = layout_cases(
        max_world=max_world, min_world=min(2, max_world), max_params=max_params, max_steps=max_steps,
        algorithm=algorithm, families=families,
    )  # fmt: skip
    if families is not None:
        return laid_out
    whole = cases(max_world=max_world, max_params=max_params, max_steps=max_steps, hsdp=hsdp, algorithm=algorithm)
    return st.one_of(whole, laid_out)


def row_block_cases(
    *, max_world: int = 2, max_params: int = 2, max_steps: int = 3, algorithm: Algorithm = MUON
) -> st.SearchStrategy[Case]:
    """Cases of Newton–Schulz on row blocks (``reference.Muon``'s ``ns_heads`` and ``ns_split``):
    FSDP2 on 1 to ``max_world`` ranks and every layout family ``layout_cases`` draws, each Muon
    matrix's rows made 2 to 4 heads of 1 to 8 rows each, or 2 to 4 blocks of 1 to 8 rows each,
    unequal (then every Muon matrix has the same rows, as one group's split fits one row count),
    so that a block boundary falls on or inside a shard, a block is smaller than a shard or a
    shard smaller than a block. Under tensor parallelism, half the splits are the fused projection
    TP lays out as users do (Megatron's fused QKV): each TP rank's rows one whole group of
    blocks, the global split that group repeated ``tp`` times, so that a candidate's path for
    blocks a rank holds whole is drawn too (80 of 2,000 cases at 4 ranks, against 28 before).
    Shrinks towards two heads of one row each on one rank. ``algorithm``: a family that declares
    the ``heads`` claim (Muon, NorMuon)."""
    bases = every_layout(max_world=max_world, max_params=max_params, max_steps=max_steps, algorithm=algorithm)
    heads_drawn, rows_drawn = st.integers(2, 4), st.integers(1, 8)
    splits_drawn = st.one_of(st.none(), st.lists(rows_drawn, min_size=2, max_size=4).map(tuple))
    fused_drawn = st.booleans()

    @st.composite
    def draw_case(draw: st.DrawFn) -> Case:
        base, split = draw(bases), draw(splits_drawn)
        if split and base.tp > 1 and draw(fused_drawn):  # each TP rank one whole (q, k, v) group
            split = split[:3] * base.tp
        heads = draw(heads_drawn) if split is None else 1
        params = []
        for p in base.params:
            if p.use_muon:
                rows = sum(split) if split else heads * draw(rows_drawn)
                p = p._replace(shape=(*p.shape[:-2], rows, p.shape[-1]))
            params.append(p)
        setting = ("ns_split", split) if split else ("ns_heads", heads)
        return replace(base, params=tuple(params), settings=(*base.settings, setting))

    return draw_case()


#: a clip's ``max_norm``: far below a drawn gradient's norm (every step clipped), near it, far above (never)
_MAX_NORMS = st.sampled_from([1.0, 1e-3, 0.5, 10.0, 1e4])
_NORM_TYPES = st.sampled_from([2.0, float("inf"), 1.0])


def clip_cases(
    *,
    max_world: int = 2,
    max_params: int = 3,
    max_steps: int = 2,
    algorithm: Algorithm,
    families: Collection[Layout] | None = None,
) -> st.SearchStrategy[Case]:
    """Cases with gradient-norm clipping before every step (``Case.clip``): FSDP2 and HSDP on 1
    to ``max_world`` ranks (``cases``), and every family ``layout_cases`` draws, where a matrix
    may be TP-replicated and, for a hybrid algorithm, a vector of AdamW's group is replicated
    over ``tp`` (or ``ep``) and sharded over the data-parallel dim; each parameter's gradients
    at a scale of their own, so that any one of them may carry most of the norm or almost none.
    A ``max_norm`` that clips every step, none, or some; the 2-, inf- and 1-norm; and one
    parameter held under a second name as well (tied) or none. Shrinks towards FSDP2 on one rank,
    one matrix, the 2-norm clipped to 1, nothing tied. ``families``: those of ``layout_cases``
    only (a negative control aimed at one)."""

    bases = every_layout(
        max_world=max_world, max_params=max_params, max_steps=max_steps, hsdp=True, algorithm=algorithm,
        families=families,
    )  # fmt: skip
    vectors = st.one_of(st.none(), st.integers(1, 3 * max_world + 1)) if algorithm.hybrid else st.none()

    @st.composite
    def draw_case(draw: st.DrawFn) -> Case:
        base = draw(bases)
        params = [p._replace(grad_scale=draw(_GRAD_SCALES)) for p in base.params]
        length = draw(vectors) if base.tp > 1 or base.ep > 1 else None
        if length is not None:
            params.append(ParamSpec(f"w{len(params)}", (length,), draw(st.sampled_from(["float32", "bfloat16"])),
                                    use_muon=False, grad_scale=draw(_GRAD_SCALES)))  # fmt: skip
        tied = draw(st.one_of(st.none(), st.sampled_from([p.name for p in params])))
        clip = Clip(draw(_MAX_NORMS), draw(_NORM_TYPES), tied)
        return replace(base, params=tuple(params), clip=clip, checkpoint_after=None)

    return draw_case()


def qk_clip_cases(*, max_world: int = 2, max_steps: int = 3) -> st.SearchStrategy[Case]:
    """Cases with QK-clip after every step (``Case.qk_clip``): a query and a key projection of 2
    to 4 heads of 1 to 4 rows each, laid out as a column-parallel weight is (TP splits the heads,
    evenly or not, FSDP2 the rows), beside the base case's other parameters, on FSDP2, HSDP and
    every family ``layout_cases`` draws; a threshold that the batch's maxima (drawn in [0, 2)
    per rank and head) cross for some heads, for every head or for none; the query's share of
    the factor. Shrinks towards two heads of one row on one rank, tau 1, alpha 0.5."""
    bases = every_layout(max_world=max_world, max_params=2, max_steps=max_steps, hsdp=True, algorithm=MUON)

    @st.composite
    def draw_case(draw: st.DrawFn) -> Case:
        base = draw(bases)
        heads, width, cols = draw(st.integers(2, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 9))
        dtype = base.params[0].dtype
        q, k = (ParamSpec(name, (heads * width, cols), dtype) for name in ("q_proj", "k_proj"))
        clip = QKClip("q_proj", "k_proj", heads, draw(st.sampled_from([1.0, 0.5, 1e-3, 4.0])),
                      draw(st.sampled_from([0.5, 0.0, 1.0, 0.25])))  # fmt: skip
        return replace(base, params=(q, k, *base.params[1:]), qk_clip=clip, checkpoint_after=None)

    return draw_case()


def replay_cases(replay: Replay, *, max_steps: int = 3, algorithm: Algorithm) -> st.SearchStrategy[Case]:
    """The cases of a replayed capture (``harness.replay``): one of its meshes, exactly as the
    replay laid it out, with the settings the file fixes; the values (the seed), the steps, the
    mode and every other setting drawn. A mesh is drawn as often as it holds parameters, so that
    cases spread over the captured parameters, not over meshes (a mesh of seven norm vectors
    beside one of every matrix drew half the cases once). Shrinks towards the first mesh, one
    step, the defaults."""

    by_params = [m for m in replay.meshes for _ in m.case.params]
    meshes, settings_drawn, steps_drawn = (
        st.sampled_from(by_params),
        settings_of(algorithm),
        st.integers(1, max_steps),
    )

    @st.composite
    def draw_case(draw: st.DrawFn) -> Case:
        replayed = draw(meshes)
        settings = {**dict(draw(settings_drawn)), **dict(replayed.fixed)}
        return replace(
            replayed.case,
            seed=draw(_SEEDS),
            steps=draw(steps_drawn),
            mode=draw(_MODES) if algorithm.orthogonalizes else None,
            settings=tuple(settings.items()),
        )

    return draw_case()


def reshard_cases(
    *, max_world: int = 2, max_params: int = 2, max_steps: int = 4, algorithm: Algorithm
) -> st.SearchStrategy[ReshardCase]:
    """A checkpoint saved on one layout and world size and loaded on another: each side drawn
    from FSDP2 on 1 to ``max_world`` ranks, pure TP, and (with four ranks) HSDP and FSDP2 × TP.
    Shrinks towards FSDP2 on one rank saved, FSDP2 on two loaded, after the first step."""
    if max_world < 2:
        raise ValueError(f"max_world={max_world}: resharding needs at least 2 ranks")

    world_drawn, steps_drawn = st.integers(1, max_world), st.integers(2, max_steps)
    # each world size's layouts, but expert parallelism
    layouts_drawn = {
        w: st.sampled_from([o for o in _layouts(w) if "ep" not in o[0].dims]) for w in range(1, max_world + 1)
    }
    base_drawn = layout_cases(max_world=1, min_world=1, max_params=max_params, max_steps=1, algorithm=algorithm)
    saved_after = {steps: st.integers(1, steps - 1) for steps in range(2, max_steps + 1)}

    @st.composite
    def draw_case(draw: st.DrawFn) -> ReshardCase:
        worlds = (draw(world_drawn), draw(world_drawn))
        sides = [(w, *draw(layouts_drawn[w])) for w in worlds]
        if sides[0] == sides[1]:
            sides[1] = (2, FSDP, (2,)) if sides[0] != (2, FSDP, (2,)) else (1, FSDP, (1,))
        steps = draw(steps_drawn)
        base = draw(base_drawn)
        params = tuple(p._replace(shape=p.shape[-2:], style=draw(_STYLES)) for p in base.params)
        for w, layout, mesh in sides:
            params = tuple(
                p._replace(shape=_buildable(p.shape, p.style, layout.degrees_on(mesh)[0], w)) for p in params
            )
        case = replace(base, params=params, steps=steps)
        before, after = (replace(case, world_size=w, mesh=m, layout=layout) for w, layout, m in sides)
        return ReshardCase(before, after, draw(saved_after[steps]))

    return draw_case()
