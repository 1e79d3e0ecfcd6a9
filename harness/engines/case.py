"""An engine case, the model it trains, and the hypothesis strategy that draws them.

The model is a ``GradientFeed``: each parameter's loss is ``(p * c).sum()``, linear in the
parameter, so its gradient is exactly the drawn ``c`` whatever the engine does in forward and
backward. Each ``c`` is a multiple of 1/8 between -1 and 1, so every sum an engine makes of
them, over micro-batches and ranks, in any order, divided by accumulation steps and world
sizes that are powers of two, is exact in float32 and in bf16 (partial sums are multiples of
1/64 below 4: at most 8 significant bits). Every engine therefore steps on exactly the
gradient the one-device side steps on, and the comparison isolates its optimizer, its
partitioning and its accumulation: a wrong reduction (one rank's gradient, a gradient
counted twice, a step per micro-batch) changes the values, a reordered one cannot.

That feed cannot see the dtype a reduction or an accumulation is carried in: its sums are exact
in bf16 too. The *precision witness* (``EngineCase.witness == "precision"``, float32 cases)
draws each ``c`` as a multiple of 2^-12 instead: a sum of at most 32 of them (8 ranks, 4
micro-batches) needs at most 17 significant bits, exact in float32 whatever the order, while bf16
keeps 8, so the witness rounds wherever it passes through bf16. An engine that reduces or
accumulates in bf16 where it declares float32 then differs bitwise; a reordered float32 one
still cannot.

Both feeds divide by powers of two only, where a wrong divisor often hides: a mean over the
wrong group of a power-of-two size, a divisor rounded to a power of two. The *divisor witness*
(``EngineCase.witness == "divisor"``, float32 cases) runs at world sizes and accumulation counts
whose product ``N`` is not a power of two (3, 5, 6, …) and draws each ``c`` as ``N·k/8``: every
division an engine makes by the world size or the accumulation count, before or after summing,
by dividing or by multiplying with the reciprocal, is exact, and so is the mean, ``Σk/8 · 1/N``
of the sum; a wrong divisor, a wrong group or a missing reduction differs wherever the drawn
``k`` do not sum to zero. A count whose reciprocal rounds the feed (7, 13, 14, 15 among those up
to 16: ``c · fl(1/7) ≠ c / 7``) is refused, since two correct engines would then differ.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

import torch
from hypothesis import strategies as st
from torch import Tensor, nn

from harness.algorithms import engine_family
from harness.engines import Engine, EngineConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: each feed's grid: its values are the multiples of 1/grid in [-1, 1] (module docstring), times
#: world size × accumulation count for the divisor witness
WITNESS_GRID = {"exact": 8, "precision": 2**12, "divisor": 8}


def power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


@functools.cache
def reciprocal_exact(d: int) -> bool:
    """Whether multiplying the divisor witness's values by ``fl(1/d)`` gives what dividing by ``d``
    does, for every world size and accumulation count up to 16 (module docstring)."""
    reciprocal = torch.tensor(1.0) / d
    fed = (torch.arange(-8, 9, dtype=torch.float32) * n / 8 for n in range(d, 16 * d + 1, d))
    return all(torch.equal(c * reciprocal, c / d) for c in fed)


#: the name of a case's first matrix where it is a query projection of ``EngineCase.heads`` heads
QUERY = "q_proj.weight"


@dataclass(frozen=True)
class AttentionConfig:
    """What a transformer's ``config`` says of its attention, as engines read it to split a
    query projection into heads (DeepSpeed's ``per_head_muon``)."""

    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_size: int


class Projection(nn.Module):
    """A module of one weight whose loss is ``(weight * c).sum()``: its own forward, in which an
    engine that gathers a module's parameters around its forward (ZeRO-3) gathers it."""

    def __init__(self, weight: nn.Parameter) -> None:
        super().__init__()
        self.weight = weight

    def forward(self, c: Tensor) -> Tensor:
        return (self.weight * c.to(self.weight)).sum().float()


class GradientFeed(nn.Module):
    """Parameters ``p0, p1, …`` of the given shapes, drawn from ``seed`` (the first a query
    projection ``q_proj.weight`` of ``heads`` heads, with the model's ``config``, where ``heads``
    is given); the loss of a micro-batch is ``Σ (p_i * c_i).sum()`` over the parameters it feeds
    (``c`` by name)."""

    def __init__(self, shapes: tuple[tuple[int, ...], ...], seed: int, dtype: str, heads: int = 1) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        for i, shape in enumerate(shapes):
            value = nn.Parameter(torch.randn(shape, generator=generator).to(DTYPES[dtype]))
            if i == 0 and heads > 1:
                self.q_proj = Projection(value)
                rows, cols = shape
                self.config = AttentionConfig(heads, heads, rows // heads, cols)
            else:
                self.register_parameter(f"p{i}", value)

    def forward(self, feed: dict[str, Tensor]) -> Tensor:
        params = dict(self.named_parameters())
        return torch.stack(
            [
                self.q_proj(c) if name == QUERY else (params[name] * c.to(params[name])).sum().float()
                for name, c in feed.items()
            ]
        ).sum()


@dataclass(frozen=True)
class EngineCase:
    """One engine run: the engine (``MODULE:FACTORY``) and what it is asked to do."""

    engine: str
    optimizer: str
    stage: int
    accumulate: int
    reduce_scatter: bool | None
    dtype: str
    shapes: tuple[tuple[int, ...], ...]
    #: the parameters no micro-batch's loss reaches (they get no gradient)
    no_grad: tuple[int, ...]
    steps: int
    seed: int
    world_size: int
    settings: tuple[tuple[str, Any], ...]
    #: save after this step and continue from a fresh engine that loads it
    checkpoint_at: int | None = None
    #: ``reference`` or ``self`` (the engine's own optimizer on one device; ``Engine.judged``)
    against: str = "reference"
    differences: tuple[str, ...] = ()
    #: what the engine does with a parameter without a gradient (``Engine.missing_gradient``)
    missing_gradient: str = "skip"
    #: after the last step, save into ``DIR/saved`` and convert it with ``Engine.reshard`` into ``DIR/resharded``
    save_to: str | None = None
    #: ``(DIR, world, steps)``: start from the checkpoint in ``DIR`` that ``steps`` steps on ``world`` ranks saved
    resumed_from: tuple[str, int, int] | None = None
    #: the reference's settings that express the engine's arithmetic (``Engine.conventions``)
    conventions: tuple[tuple[str, Any], ...] = ()
    #: the engine's own one-device optimizer is compared too, shown beside the verdict (``Engine.shown``)
    shown: bool = False
    #: the heads of the first matrix, a query projection (``QUERY``) the engine orthogonalizes per
    #: head (``Engine.per_head``); 1: no such matrix
    heads: int = 1
    #: the max norm the engine clips the gradients to (0: none), and how it scales them (``Engine.clip``)
    clip: float = 0.0
    clip_form: str = "torch"
    #: what the engine's declaration took out of the drawn case (``Engine.needs_every_grad``), said in its description
    narrowed: tuple[str, ...] = ()
    #: ``(parameter, rank)``: that rank's micro-batches never reach that parameter, while another
    #: rank's do (a layer a rank's tokens skip, an expert with no tokens there): the mean counts
    #: the rank's gradient as zeros
    missing_on: tuple[tuple[int, int], ...] = ()
    #: the gradient feed (module docstring): ``"exact"`` (multiples of 1/8, exact in bf16 too) or
    #: ``"precision"`` (multiples of 2^-12, exact in float32 only: a witness of the reduction's dtype)
    witness: str = "exact"

    def __post_init__(self) -> None:
        for i, r in self.missing_on:
            if not 0 <= i < len(self.shapes) or i in self.no_grad or not 0 <= r < self.world_size:
                raise ValueError(
                    f"EngineCase missing_on=({i}, {r}): a parameter with a gradient and a rank of the case"
                )
        for i in {i for i, _ in self.missing_on}:
            if sum(1 for j, _ in self.missing_on if j == i) >= self.world_size:
                raise ValueError(f"EngineCase missing_on: p{i} on every rank; that is no_grad")
        if self.witness not in WITNESS_GRID:
            raise ValueError(f"EngineCase witness={self.witness!r}: one of {sorted(WITNESS_GRID)}")
        if self.witness in ("precision", "divisor") and self.dtype != "float32":
            raise ValueError(
                f"EngineCase witness={self.witness!r} with dtype={self.dtype}: the witness needs float32 gradients "
                "(bf16 ones round it themselves)"
            )
        counts = (("world_size", self.world_size), ("accumulate", self.accumulate))
        if self.witness == "divisor":
            if power_of_two(self.world_size * self.accumulate):
                raise ValueError(
                    f"EngineCase witness='divisor' with world_size={self.world_size}, accumulate={self.accumulate}: "
                    "their product must not be a power of two, or the witness divides as the exact feed does"
                )
            for what, n in counts:
                if n < 1 or not reciprocal_exact(n):
                    raise ValueError(f"EngineCase {what}={n}: its reciprocal rounds the divisor witness's values")
            return
        for what, n in counts:
            if not power_of_two(n):
                raise ValueError(
                    f"EngineCase {what}={n}: a power of two, so that every sum of the feed is exact "
                    "(other counts are the divisor witness's)"
                )

    @property
    def config(self) -> EngineConfig:
        return EngineConfig(
            self.optimizer, self.stage, self.accumulate, self.reduce_scatter, self.dtype, self.settings, self.clip
        )

    @property
    def self_reference(self) -> bool:
        return self.against == "self"

    @property
    def reference(self) -> type[torch.optim.Optimizer]:
        """muongate's reference of the optimizer (what ``against == "reference"`` steps)."""
        return engine_family(self.optimizer).factory

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(QUERY if i == 0 and self.heads > 1 else f"p{i}" for i in range(len(self.shapes)))

    def feed(self, step: int, rank: int, micro: int) -> dict[str, Tensor]:
        """``c`` of every parameter with a gradient, for one micro-batch of one rank."""
        generator = torch.Generator().manual_seed(hash((self.seed, step, rank, micro)) % 2**62)
        grid = WITNESS_GRID[self.witness]
        scale = self.world_size * self.accumulate if self.witness == "divisor" else 1
        return {
            name: torch.randint(-grid, grid + 1, shape, generator=generator).float() * scale / grid
            for i, (name, shape) in enumerate(zip(self.names, self.shapes, strict=True))
            if i not in self.no_grad and (i, rank) not in self.missing_on
        }

    def mean_gradient(self, step: int) -> dict[str, Tensor]:
        """What every engine must step on: the mean over ranks of each rank's accumulated
        micro-batch gradients, each divided by the accumulation steps (exact, see the module);
        zeros for the parameters without one where the engine steps those on zeros."""
        total: dict[str, Tensor] = {
            self.names[i]: torch.zeros(self.shapes[i]) for i in self.no_grad if self.missing_gradient == "zeros"
        }
        for rank in range(self.world_size):
            for micro in range(self.accumulate):
                for name, c in self.feed(step, rank, micro).items():
                    total[name] = total.get(name, torch.zeros_like(c)) + c
        return {name: g / (self.accumulate * self.world_size) for name, g in total.items()}

    def describe(self) -> str:
        shapes = " ".join(
            f"{n}{list(s)}" + (" (no grad)" if i in self.no_grad else "")
            for i, (n, s) in enumerate(zip(self.names, self.shapes, strict=True))
        )
        scatter = "" if self.reduce_scatter is None else f" reduce_scatter={'on' if self.reduce_scatter else 'off'}"
        if self.missing_gradient == "zeros" and self.no_grad:
            shapes += " (a missing gradient steps as zeros, as the engine declares)"
        for i in sorted({i for i, _ in self.missing_on}):
            ranks = sorted(r for j, r in self.missing_on if j == i)
            shapes += f"; {self.names[i]} without a gradient on rank{'s' if len(ranks) > 1 else ''} "
            shapes += ", ".join(map(str, ranks))
        saved = "" if self.checkpoint_at is None else f", saved and loaded after step {self.checkpoint_at}"
        if self.resumed_from is not None:
            saved += f", resumed from {self.resumed_from[2]} step(s) on {self.resumed_from[1]} ranks (resharded)"
        if self.save_to is not None:
            saved += ", then saved and resharded"
        settings = ", ".join(f"{k}={v}" for k, v in self.settings)
        declared = f"; declared differences: {', '.join(self.differences)}" if self.differences else ""
        if self.conventions and not self.self_reference:
            declared += "; the reference on the engine's conventions: " + ", ".join(
                f"{k}={str(v).removeprefix('torch.')}" for k, v in self.conventions
            )
        if self.shown:
            declared += "; its own one-device optimizer shown beside"
        if self.heads > 1:
            declared += f"; {QUERY} orthogonalized per head, {self.heads} heads"
        if self.clip:
            declared += f"; gradients clipped to norm {self.clip:g} ({self.clip_form})"
        if self.narrowed:
            declared += "; narrowed: " + ", ".join(self.narrowed)
        if self.witness == "precision":
            declared += "; precision witness feed (multiples of 2^-12: exact in float32, rounded by bf16)"
        if self.witness == "divisor":
            n = self.world_size * self.accumulate
            declared += f"; divisor witness feed (multiples of {n}/8: every division by {n} and its factors exact)"
        return (
            f"{self.engine} stage {self.stage} {self.optimizer} ({settings}), accumulate {self.accumulate}{scatter}, "
            f"{self.dtype}, {shapes}, {self.steps} step(s){saved}, seed {self.seed}, {self.world_size} ranks{declared}"
        )


#: the shapes every engine cell tries first, in every profile: one ``[1, 3]`` matrix, whose three
#: elements straddle two partitions at 2 and 4 ranks (a ZeRO engine that reduces only a rank's own
#: part of a split matrix, DeepSpeed 0.17.6 to 0.19.2 with ``reduce_scatter`` on, matrix finding 26,
#: is red on it; 20 drawn cases of ``dev`` did not always draw one)
STRADDLE: tuple[tuple[int, ...], ...] = ((1, 3),)


def _shapes(max_params: int) -> st.SearchStrategy[tuple[tuple[int, ...], ...]]:
    """The straddling case (``STRADDLE``: what hypothesis tries first and shrinks towards), or up
    to ``max_params`` matrices and vectors of sides 1 to 9."""
    matrix = st.tuples(st.integers(1, 9), st.integers(1, 9))
    vector = st.tuples(st.integers(1, 9))
    drawn = st.lists(st.one_of(matrix, vector), min_size=1, max_size=max_params).map(tuple)
    return st.one_of(st.just(STRADDLE), drawn)


def _settings(optimizer: str, options: Any = None) -> st.SearchStrategy[tuple[tuple[str, Any], ...]]:
    """The common settings of ``optimizer`` and the engine's own ``options`` (``Engine.options``)."""
    common = {"lr": st.sampled_from([0.02, 0.005]), "weight_decay": st.sampled_from([0.0, 0.1])}
    own = (
        {"momentum": st.sampled_from([0.95, 0.9])}
        if optimizer == "muon"
        else {"betas": st.sampled_from([(0.9, 0.999), (0.9, 0.95)]), "eps": st.just(1e-8)}
    )
    engine = {k: st.sampled_from(v) for k, v in (options or {}).items()}
    return st.fixed_dictionaries({**common, **own, **engine}).map(lambda d: tuple(sorted(d.items())))


def engine_cases(
    spec: str,
    declared: Engine,
    world_size: int,
    *,
    max_steps: int = 3,
    max_params: int = 4,
    checkpoint: bool = True,
    stage: int | None = None,
    optimizer: str | None = None,
    accumulate: int | None = None,
    dtype: str | None = None,
    witness: str = "exact",
    asymmetric: bool = False,
) -> st.SearchStrategy[EngineCase]:
    """Cases of everything ``declared`` (or of the one ``stage``, ``optimizer``, ``accumulate``
    and ``dtype`` given): its ``reduce_scatter`` settings and dtypes, parameters of shapes
    that straddle the partitions at every world size (uneven by construction), some without
    gradients, and a checkpoint where the stage declares one; fed by ``witness``'s feed;
    ``asymmetric``: one parameter with a gradient on some ranks only (``EngineCase.missing_on``)."""

    def one(given: Any, declared_values: Any) -> st.SearchStrategy[Any]:
        return st.just(given) if given is not None else st.sampled_from(sorted(declared_values))

    counts = divisor_counts(declared, world_size) if witness == "divisor" else exact_counts(declared)

    @st.composite
    def build(draw: Any) -> EngineCase:
        chosen = draw(one(optimizer, declared.optimizers))
        at = draw(one(stage, declared.stages))
        scatter = declared.scatter_of(chosen, at)
        shapes = draw(_shapes(max_params))
        no_grad = tuple(i for i in range(len(shapes)) if len(shapes) > 1 and draw(st.integers(0, 3)) == 0)
        if len(no_grad) == len(shapes):
            no_grad = no_grad[1:]
        steps = draw(st.integers(1, max_steps))
        saves = checkpoint and steps > 1 and at in declared.checkpoint  # type: ignore[operator]
        case = EngineCase(
            engine=spec,
            optimizer=chosen,
            stage=at,
            accumulate=draw(one(accumulate, counts)),
            # on first (the straddling case is tried with it): ZeRO's default, and where finding 26 shows
            reduce_scatter=None if scatter is None else draw(st.sampled_from(sorted(scatter, reverse=True))),
            dtype=draw(one(dtype, declared.dtypes)),
            shapes=shapes,
            no_grad=no_grad,
            steps=steps,
            seed=draw(st.integers(0, 2**16)),
            world_size=world_size,
            settings=draw(_settings(chosen, declared.options.get(chosen))),
            checkpoint_at=draw(st.none() | st.integers(0, steps - 2)) if saves else None,
            witness=witness,
        )
        if asymmetric:
            fed = [i for i in range(len(shapes)) if i not in no_grad]
            if len(fed) < 2:  # every rank's loss must reach some parameter
                case = replace(case, shapes=(*shapes, (2, 2)))
                fed.append(len(shapes))
            lonely = draw(st.sampled_from(fed))
            ranks = draw(st.sets(st.integers(0, world_size - 1), min_size=1, max_size=world_size - 1))
            case = replace(case, missing_on=tuple((lonely, r) for r in sorted(ranks)))
        return judged(case, declared)

    return build()


def exact_counts(declared: Engine) -> tuple[int, ...]:
    """The accumulation counts the exact and precision feeds take: the declared powers of two."""
    return tuple(a for a in declared.accumulate if power_of_two(a))  # type: ignore[attr-defined]


def divisor_counts(declared: Engine, world_size: int) -> tuple[int, ...]:
    """The declared accumulation counts the divisor witness takes on ``world_size`` ranks: those
    whose product with it is not a power of two, each with an exact reciprocal (module docstring)."""
    if not reciprocal_exact(world_size):
        return ()
    return tuple(
        a
        for a in declared.accumulate  # type: ignore[attr-defined]
        if not power_of_two(a * world_size) and reciprocal_exact(a)
    )


def per_head_cases(spec: str, declared: Engine, world_size: int, *, stage: int) -> st.SearchStrategy[EngineCase]:
    """Cases of the engine's per-head Muon (``Engine.per_head``) at ``stage``: ``engine_cases``'
    Muon cases, the first matrix a query projection of 2 to 4 heads of 1 to 4 rows each, with a
    gradient, and the engine's per-head setting on."""
    assert declared.per_head is not None, "the engine declares no per-head setting"
    on = declared.per_head

    @st.composite
    def build(draw: Any) -> EngineCase:
        case = draw(engine_cases(spec, declared, world_size, stage=stage, optimizer="muon", checkpoint=False))
        heads, width, cols = draw(st.integers(2, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 9))
        settings = tuple(sorted({**dict(case.settings), on: True}.items()))
        shaped = replace(
            case, shapes=((heads * width, cols), *case.shapes[1:]), no_grad=tuple(i for i in case.no_grad if i),
            settings=settings, heads=heads,
        )  # fmt: skip
        return judged(shaped, declared)

    return build()


def clip_cases(
    spec: str, declared: Engine, world_size: int, *, stage: int, optimizer: str
) -> st.SearchStrategy[EngineCase]:
    """Float32 cases of ``engine_cases`` at ``stage`` with the gradients clipped to a max norm that
    clips every step (the feed's norms are about 1 to 6), some steps, or none, scaled in the
    engine's declared form (``Engine.clip``)."""
    assert declared.clip is not None, "the engine declares no clipping"
    form = declared.clip

    @st.composite
    def build(draw: Any) -> EngineCase:
        base = engine_cases(spec, replace(declared, dtypes={"float32"}), world_size, stage=stage, optimizer=optimizer)
        case = replace(draw(base), clip=draw(st.sampled_from([1.0, 0.25, 2.0, 100.0])))
        scaled = form(case.config)
        assert scaled is not None, f"the engine reports no clipping norm for {case.describe()}"
        return replace(case, clip_form=scaled)

    return build()


def judged(case: EngineCase, declared: Engine) -> EngineCase:
    """The case with what the engine declares it is judged against, the reference's settings
    that express its arithmetic, and its declared differences."""
    conventions = {} if declared.conventions is None else dict(declared.conventions(case.config))
    if (
        (case.no_grad or case.missing_on)
        and declared.needs_every_grad is not None
        and declared.needs_every_grad(case.config)
    ):
        case = replace(
            case, no_grad=(), missing_on=(), narrowed=("every parameter has a gradient (the engine needs one here)",)
        )
    if case.missing_on and declared.needs_same_grads is not None and declared.needs_same_grads(case.config):
        case = replace(
            case,
            missing_on=(),
            narrowed=("every rank's loss reaches the same parameters (the engine needs it here)",),
        )
    return replace(
        case,
        against=declared.judged[case.optimizer],  # type: ignore[index]
        differences=declared.differences_of(case.optimizer),
        missing_gradient=declared.missing_gradient,
        conventions=tuple(sorted(conventions.items())),
        shown=case.optimizer in declared.shown,  # type: ignore[operator]
    )
