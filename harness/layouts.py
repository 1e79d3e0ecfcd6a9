"""Every layout family, each one ``Layout`` value: the one module that spells their names.

A family has two spellings on purpose, both kept here and nowhere else: ``name``, the ASCII
one code and ``Candidate(layouts=…)`` use (what users type, so no ``×``), and ``title``, what
records and reports show (``fsdp×tp``; streams written before keep matching). Each value
also says on which mesh it runs for a world size and how that mesh's dims are named, which
strategy draws it, and which rank-side function builds it (``harness.tasks.layouts``, named
here and imported when a rank asks, so that the parent never imports the rank side).

A case is placed in its family by its own data (``of``): its mesh, its tensor- and
expert-parallel degrees, whether it holds expert stacks, and whether the runner's adaptation
gave it to a candidate that shards on its own (``own``). Nothing here asks the candidate.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

#: the strategies that draw the families (``harness.cases.strategies``)
LAYOUT_CASES = "harness.cases.strategies:layout_cases"
OPTIMIZER_CASES = "harness.cases.strategies:cases"


@dataclass(frozen=True)
class Layout:
    """One layout family: its names, its mesh, who draws it and who builds it."""

    #: the one spelling in code: what ``Candidate(layouts=…)`` declares
    name: str
    #: what records and reports show
    title: str
    #: the mesh's dim names (``DeviceMesh``'s ``mesh_dim_names``)
    dims: tuple[str, ...]
    #: ``module:function`` of the rank-side builder (``harness.tasks.layouts``)
    builder: str
    #: ``module:function`` of the strategy that draws it (``None``: none draws it)
    strategy: str | None
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

    def degrees(self, world: int) -> tuple[int, int]:
        """``(tp, ep)``: the tensor- and expert-parallel ranks of this family on ``world`` ranks."""
        mesh = self.mesh(world)
        if mesh is None:
            raise ValueError(f"layout {self.name} does not run on {world} ranks")
        tp = mesh[-1] if "tp" in self.dims else 1
        return tp, 2 if "ep" in self.dims else 1

    def build(self) -> Callable[..., Any]:
        """The builder itself: ``(case, named tensors, mesh, *, linears) -> nn.Module``."""
        module, _, function = self.builder.partition(":")
        return getattr(importlib.import_module(module), function)  # type: ignore[no-any-return]


_FULLY_SHARD = "harness.tasks.layouts:data_parallel"
_TENSOR_PARALLEL = "harness.tasks.layouts:tensor_parallel"

FSDP = Layout("fsdp", "fsdp", ("shard",), _FULLY_SHARD, LAYOUT_CASES, declared=False)
#: expert stacks ``[E, rows, cols]`` under FSDP2 on a 1-D mesh: whole experts on each rank
EXPERTS = Layout("3-D", "3-D", ("shard",), _FULLY_SHARD, OPTIMIZER_CASES, declared=False)
#: a candidate's own ``shard`` on a 1-D mesh (its declaration; not drawn: the adaptation gives it)
OWN = Layout("own", "own", ("shard",), "harness.tasks.layouts:own_sharding", None, declared=False)
HSDP = Layout("hsdp", "hsdp", ("replicate", "shard"), _FULLY_SHARD, LAYOUT_CASES)
TP = Layout("tp", "tp", ("tp",), _TENSOR_PARALLEL, LAYOUT_CASES)
FSDP_TP = Layout("fsdp_tp", "fsdp×tp", ("dp", "tp"), _TENSOR_PARALLEL, LAYOUT_CASES)
HSDP_TP = Layout("hsdp_tp", "hsdp×tp", ("rep", "dp", "tp"), _TENSOR_PARALLEL, LAYOUT_CASES)
EP_EFSDP = Layout("ep_efsdp", "ep×efsdp", ("ep", "efsdp"), "harness.tasks.layouts:expert_parallel", LAYOUT_CASES)

#: every family, in the order reports list them
LAYOUTS = (FSDP, EXPERTS, OWN, HSDP, TP, FSDP_TP, HSDP_TP, EP_EFSDP)
#: the families a candidate declares, by their names
DECLARABLE = frozenset(layout.name for layout in LAYOUTS if layout.declared)
#: the families ``layout_cases`` draws on a world size, in the order it shrinks through them
#: (FSDP2 on a 1-D mesh first, then pure TP)
DRAWN = (FSDP, TP, FSDP_TP, HSDP, EP_EFSDP, HSDP_TP)


def named(name: str) -> Layout:
    """The family of ``name`` (its ``name`` or its ``title``)."""
    for layout in LAYOUTS:
        if name in (layout.name, layout.title):
            return layout
    raise ValueError(f"no layout {name!r}; the layouts are {', '.join(layout.name for layout in LAYOUTS)}")


def of(
    world: int, mesh: tuple[int, ...], tp: int, ep: int, shapes: Iterable[tuple[int, ...]], *, own: bool = False
) -> Layout:
    """The family of a case's data: ``own`` on a 1-D mesh without TP or EP, a candidate's own
    sharding; else by its degrees and mesh (pure TP where every rank is a TP rank); on a 1-D
    mesh, ``3-D`` where it holds an expert stack."""
    if tp == ep == 1 and len(mesh) == 1 and own:
        return OWN
    if ep > 1:
        return EP_EFSDP
    if tp > 1:
        return TP if tp == world else HSDP_TP if len(mesh) == 3 else FSDP_TP
    if len(mesh) > 1:
        return HSDP
    return EXPERTS if any(len(s) == 3 for s in shapes) else FSDP


def fully_sharded(ndim: int) -> Layout:
    """FSDP2's own layout on a mesh of ``ndim`` dims: ``fully_shard`` on 1-D, HSDP on 2-D."""
    return FSDP if ndim == 1 else HSDP
