"""Cases (what one distributed example is) and the hypothesis strategies that draw them.

A ``Case`` is a frozen, picklable record with a seed and never a tensor: every rank
builds the same tensors from it (``harness.tensors``). Hypothesis runs in the pytest
parent only; ranks receive concrete cases, so shrinking is just more cases.

Strategies shrink towards the simplest case: one rank, a small square float32 matrix,
one step, default settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple

from hypothesis import strategies as st

DType = Literal["float32", "bfloat16"]
GradKind = Literal["normal", "zero", "none", "every_other"]
Mode = Literal["all_ranks", "owner_split"]


class ParamSpec(NamedTuple):
    """One parameter of a case: its name, global shape, dtype, group and gradient pattern."""

    name: str
    shape: tuple[int, ...]
    dtype: DType = "float32"
    use_muon: bool = True
    grad: GradKind = "normal"
    grad_scale: float = 1.0


@dataclass(frozen=True)
class Case:
    """One optimizer example: parameters, settings, steps, world and layout, and a seed."""

    params: tuple[ParamSpec, ...]
    seed: int = 0
    world_size: int = 1
    mesh: tuple[int, ...] = (1,)
    steps: int = 1
    mode: Mode | None = "all_ranks"
    settings: tuple[tuple[str, Any], ...] = ()
    candidate: str = "distributed_impl:ShardedMuon"
    checkpoint_after: int | None = None
    label: str = field(default="", compare=False)

    def settings_dict(self) -> dict[str, Any]:
        """Optimizer keyword arguments; ``ns_dtype`` is stored by name and turned into a dtype here."""
        import torch

        out = dict(self.settings)
        if "ns_dtype" in out:
            out["ns_dtype"] = getattr(torch, out["ns_dtype"])
        return out

    def with_world(self, world_size: int) -> Case:
        return replace(self, world_size=world_size, mesh=(world_size,))

    def describe(self) -> str:
        shapes = ", ".join(
            f"{p.name}{list(p.shape)}:{p.dtype}{'' if p.use_muon else ':adamw'}{'' if p.grad == 'normal' else ':' + p.grad}"
            for p in self.params
        )
        settings = ", ".join(f"{k}={v!r}" for k, v in self.settings)
        return (
            f"Case(world={self.world_size}, mesh={self.mesh}, steps={self.steps}, mode={self.mode}, "
            f"seed={self.seed}, params=[{shapes}], settings={{{settings}}}"
            + (f", checkpoint_after={self.checkpoint_after}" if self.checkpoint_after is not None else "")
            + (f", candidate={self.candidate}" if self.candidate != "distributed_impl:ShardedMuon" else "")
            + ")"
        )


def _check_bounds(name_lo: str, lo: int, name_hi: str, hi: int) -> None:
    if lo < 1:
        raise ValueError(f"{name_lo}={lo} must be at least 1")
    if lo > hi:
        raise ValueError(f"{name_lo}={lo} is larger than {name_hi}={hi}")


@st.composite
def matrix_shapes(
    draw: st.DrawFn, *, min_side: int = 1, max_side: int = 48, world_size: int = 2, experts: bool = False
) -> tuple[int, ...]:
    """2-D shapes (square, tall, wide, 1 row, fewer rows than ranks, rows not divisible by
    the world size, prime sides) and, with ``experts``, 3-D ``[E, rows, cols]`` stacks.

    Shrinks towards a small square matrix.
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
    rows, cols = draw(st.one_of(special, st.tuples(sides, sides)))
    rows, cols = max(min_side, min(rows, max_side)), max(min_side, min(cols, max_side))
    if experts and draw(st.booleans()):
        return (draw(st.integers(1, 2 * world_size + 1)), rows, cols)
    return (rows, cols)


@st.composite
def muon_settings(draw: st.DrawFn, *, conventions: bool = True) -> tuple[tuple[str, Any], ...]:
    """Hyper-parameters and (with ``conventions``) the convention settings of ``reference.Muon``.

    Shrinks towards the defaults (each setting's first option).
    """
    items: dict[str, Any] = {
        "lr": draw(st.sampled_from([0.02, 0.1, 1e-3, 0.5])),
        "momentum": draw(st.one_of(st.just(0.95), st.floats(0.0, 0.99, allow_subnormal=False))),
        "nesterov": draw(st.booleans().map(lambda b: not b)),
        "weight_decay": draw(st.sampled_from([0.0, 0.1, 0.01])),
        "ns_steps": draw(st.sampled_from([5, 1, 3, 0])),
    }
    if conventions:
        items["momentum_form"] = draw(st.sampled_from(["ema", "sum"]))
        items["ns_coefficients"] = draw(st.sampled_from(["keller", "polar_express"]))
        items["eps_form"] = draw(st.sampled_from(["add", "clamp"]))
        items["ns_dtype"] = draw(st.sampled_from(["bfloat16", "float32"]))
        items["adjust_lr_fn"] = draw(st.sampled_from(["original", "match_rms_adamw", "none"]))
    return tuple(items.items())


@st.composite
def cases(
    draw: st.DrawFn,
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
) -> Case:
    """Whole optimizer cases. Shrinks towards one rank, one small square fp32 matrix, one step."""
    for name, value in (("max_world", max_world), ("max_params", max_params), ("max_steps", max_steps)):
        if value < 1:
            raise ValueError(f"{name}={value} must be at least 1")
    world = draw(st.integers(1, max_world))
    mesh: tuple[int, ...] = (world,)
    if hsdp and world >= 4 and world % 2 == 0 and draw(st.booleans()):
        mesh = (2, world // 2)
    shards = mesh[-1]
    n = draw(st.integers(1, max_params))
    params = []
    for i in range(n):
        use_muon = i == 0 or not adamw or draw(st.booleans())
        if use_muon:
            shape = draw(matrix_shapes(max_side=max_side, world_size=shards, experts=experts))
        else:
            shape = draw(
                st.one_of(st.tuples(st.integers(1, max_side)), matrix_shapes(max_side=max_side, world_size=shards))
            )
        params.append(
            ParamSpec(
                name=f"w{i}",
                shape=shape,
                dtype=draw(st.sampled_from(dtypes)),
                use_muon=use_muon,
                grad=draw(st.sampled_from(["normal", "normal", "zero", "none", "every_other"])) if i else "normal",
                grad_scale=draw(st.sampled_from([1.0, 1e-3, 1e3])),
            )
        )
    steps = draw(st.integers(1, max_steps))
    return Case(
        params=tuple(params),
        seed=draw(st.integers(0, 2**31 - 1)),
        world_size=world,
        mesh=mesh,
        steps=steps,
        mode=draw(st.sampled_from(["all_ranks", "owner_split"])),
        settings=draw(muon_settings()),
        checkpoint_after=draw(st.integers(1, steps - 1)) if checkpoint and steps > 1 else None,
    )
