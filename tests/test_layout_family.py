"""Claims about ``harness.layouts``: each family's one value says on which mesh it runs, how
its dims are named, and which builder lays it out, and a case's own data places it back in
that family."""

from __future__ import annotations

import pytest

import reference
from harness import layouts
from harness.cases import Case, ParamSpec
from harness.layouts import DRAWN, LAYOUTS, Layout


def test_every_family_has_its_own_name_and_title() -> None:
    assert len({layout.name for layout in LAYOUTS}) == len({layout.title for layout in LAYOUTS}) == len(LAYOUTS)
    assert all(layouts.named(layout.name) is layout is layouts.named(layout.title) for layout in LAYOUTS)


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_every_family_names_a_builder_that_exists(layout: Layout) -> None:
    assert callable(layout.build())


@pytest.mark.parametrize("world", range(1, 9))
def test_a_case_drawn_on_a_family_is_placed_back_in_it(world: int) -> None:
    for layout in DRAWN:
        mesh = layout.mesh(world)
        if mesh is None:
            continue
        tp, ep = layout.degrees(world)
        assert len(mesh) == len(layout.dims), layout
        case = Case((ParamSpec("w0", (4, 4)),), world_size=world, mesh=mesh, tp=tp, ep=ep, reference=reference.Muon)
        assert case.layout is layout


def test_a_case_is_own_only_where_the_adaptation_says_so() -> None:
    case = Case((ParamSpec("w0", (2, 4, 4)),), world_size=2, mesh=(2,), reference=reference.Muon)
    assert case.layout is layouts.EXPERTS
    assert Case(case.params, world_size=2, mesh=(2,), own=True, reference=reference.Muon).layout is layouts.OWN
