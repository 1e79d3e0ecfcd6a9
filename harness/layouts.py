"""Every layout family, each one ``Layout`` value: the one module that spells their names.

A family has two spellings on purpose, both kept here and nowhere else: ``name``, the ASCII
one code and ``Candidate(layouts=…)`` use (what users type, so no ``×``), and ``title``, what
records and reports show (``fsdp×tp``; streams written before keep matching). Each value
also says on which mesh it runs for a world size, how that mesh's dims are named, and which
placements its builder gives a parameter (``lays_out``: what the replay matches a capture with,
and which captured meshes it may lay out, ``replayed``), so that a new family is a value here
and its builder. The
strategies that draw the families (``harness.cases.strategies``: ``DRAWN`` below, ``EXPERTS``
by the optimizer cases) and the rank side's builders (``harness.tasks.layouts.BUILDERS``, by
family name, held to every family here by a test) import this module; it imports neither.

A case carries its family (``Case.layout``) beside its mesh, and reads its tensor- and
expert-parallel degrees from them (``Layout.degrees_on``). FSDP2 on a 1-D mesh has two titles,
by the case's own data: ``3-D`` where it holds an expert stack (``fully_sharded``). Nothing
here asks the candidate: the runner's adaptation gives a case to ``OWN`` where the candidate
shards on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

#: one placement as the replay compares them: ``("shard", dim)``, ``("strided", dim, split
#: factor)`` (FSDP2 over TP's ``_StridedShard``), ``("replicate",)``, ``("partial",)``
Placement = tuple[Any, ...]
#: what a family's builder (``harness.tasks.layouts``) gives a parameter: ``(style, ndim, mesh)``
#: to its placements, ``style`` its TP style (``colwise``, ``rowwise``, ``replicate``)
LaysOut = Callable[[str, int, Sequence[int]], tuple[Placement, ...]]
_S0, _S1, _R = ("shard", 0), ("shard", 1), ("replicate",)


def _fsdp(style: str, ndim: int, mesh: Sequence[int]) -> tuple[Placement, ...]:
    return (_S0,)


def _tp(style: str, ndim: int, mesh: Sequence[int]) -> tuple[Placement, ...]:
    return ({"colwise": _S0, "rowwise": _S1}.get(style, _R) if ndim == 2 else _R,)


def _hsdp(style: str, ndim: int, mesh: Sequence[int]) -> tuple[Placement, ...]:
    return (_R, _S0)


def _fsdp_tp(style: str, ndim: int, mesh: Sequence[int]) -> tuple[Placement, ...]:
    """FSDP2 over TP: a colwise matrix's rows split twice (FSDP2's strided shard over TP's)."""
    split = {"colwise": (("strided", 0, mesh[-1]), _S0), "rowwise": (_S0, _S1)}
    return split.get(style, (_S0, _R)) if ndim == 2 else (_S0, _R)


def _hsdp_tp(style: str, ndim: int, mesh: Sequence[int]) -> tuple[Placement, ...]:
    return (_R, *_fsdp_tp(style, ndim, mesh))


def _ep_efsdp(style: str, ndim: int, mesh: Sequence[int]) -> tuple[Placement, ...]:
    """Expert stacks split by expert over ``ep`` and by row over ``efsdp``; the rest HSDP's."""
    return (_S0, _S1) if ndim == 3 else (_R, _S0)


@dataclass(frozen=True)
class Layout:
    """One layout family: its names and its mesh."""

    #: the one spelling in code: what ``Candidate(layouts=…)`` declares
    name: str
    #: what records and reports show
    title: str
    #: the mesh's dim names (``DeviceMesh``'s ``mesh_dim_names``)
    dims: tuple[str, ...]
    #: the placements its builder gives each parameter: what the replay matches a capture with
    #: (``tests/test_replay.py`` holds the two together on captures of every family)
    lays_out: LaysOut
    #: whether a candidate takes it only where it declares it (FSDP2's own 1-D ones it always takes)
    declared: bool = True

    def __str__(self) -> str:
        return self.title

    def mesh(self, world: int) -> tuple[int, ...] | None:
        """The mesh of this family on ``world`` ranks (``None``: it does not run there); the
        pool's 2-D mesh is ``(2, world // 2)``, its 3-D one ``(2, 2, world // 4)``
        (``harness.ranks.grid_shapes``)."""
        if len(self.dims) == 1:
            return (world,) if world > 1 or "tp" not in self.dims else None  # TP on one rank is FSDP2
        if len(self.dims) == 2:
            return (2, world // 2) if world >= 4 and world % 2 == 0 else None
        return (2, 2, world // 4) if world >= 8 and world % 4 == 0 else None

    @property
    def min_world(self) -> int:
        """The fewest ranks it runs on (``mesh``): 1 for FSDP2, 2 for TP, 4 for a 2-D family, 8 for HSDP × TP."""
        return next(w for w in range(1, 9) if self.mesh(w) is not None)

    def degrees_on(self, mesh: tuple[int, ...]) -> tuple[int, int]:
        """``(tp, ep)``: the tensor- and expert-parallel ranks of this family on ``mesh`` (its
        ``tp`` and ``ep`` dims' sizes, 1 where it has none)."""
        if len(mesh) != len(self.dims):
            raise ValueError(f"layout={self.name} runs on a mesh of dims {self.dims}, not mesh={list(mesh)}")
        sizes = dict(zip(self.dims, mesh, strict=True))
        return sizes.get("tp", 1), sizes.get("ep", 1)


FSDP = Layout("fsdp", "fsdp", ("shard",), _fsdp, declared=False)
#: expert stacks ``[E, rows, cols]`` under FSDP2 on a 1-D mesh: whole experts on each rank
EXPERTS = Layout("3-D", "3-D", ("shard",), _fsdp, declared=False)
#: a candidate's own ``shard`` on a 1-D mesh (its declaration; not drawn: the adaptation gives it)
OWN = Layout("own", "own", ("shard",), _fsdp, declared=False)
HSDP = Layout("hsdp", "hsdp", ("replicate", "shard"), _hsdp)
TP = Layout("tp", "tp", ("tp",), _tp)
FSDP_TP = Layout("fsdp_tp", "fsdp×tp", ("dp", "tp"), _fsdp_tp)
HSDP_TP = Layout("hsdp_tp", "hsdp×tp", ("rep", "dp", "tp"), _hsdp_tp)
EP_EFSDP = Layout("ep_efsdp", "ep×efsdp", ("ep", "efsdp"), _ep_efsdp)

#: every family, in the order reports list them (and the replay prefers on a tie)
LAYOUTS = (FSDP, EXPERTS, OWN, HSDP, TP, FSDP_TP, HSDP_TP, EP_EFSDP)
#: the families a candidate declares, by their names
DECLARABLE = frozenset(layout.name for layout in LAYOUTS if layout.declared)
#: the families ``layout_cases`` draws on a world size, in the order it shrinks through them
#: (FSDP2 on a 1-D mesh first, then pure TP)
DRAWN = (FSDP, TP, FSDP_TP, HSDP, EP_EFSDP, HSDP_TP)


def replayed(ndim: int) -> tuple[Layout, ...]:
    """The families the replay may lay a captured mesh of ``ndim`` dims out as: the drawn ones
    of that many dims, in ``LAYOUTS``'s order, which the replay prefers on a tie."""
    return tuple(layout for layout in LAYOUTS if layout in DRAWN and len(layout.dims) == ndim)


def named(name: str) -> Layout:
    """The family of ``name`` (its ``name`` or its ``title``)."""
    for layout in LAYOUTS:
        if name in (layout.name, layout.title):
            return layout
    raise ValueError(f"no layout {name!r}; the layouts are {', '.join(layout.name for layout in LAYOUTS)}")


def fully_sharded(ndim: int, shapes: Iterable[tuple[int, ...]] = ()) -> Layout:
    """FSDP2's own layout on a mesh of ``ndim`` dims: ``fully_shard`` on 1-D (titled ``3-D``
    where ``shapes`` hold an expert stack), HSDP on 2-D."""
    if ndim > 1:
        return HSDP
    return EXPERTS if any(len(s) == 3 for s in shapes) else FSDP
