"""Claims about ``harness.layouts``: each family's one value says on which mesh it runs, how
its dims are named, the rank side lays each out (``harness.tasks.layouts.BUILDERS``), and a case carries its family beside a mesh
of that family's dims, reading its tensor- and expert-parallel degrees from them."""

from __future__ import annotations

from dataclasses import replace

import pytest

import reference
from harness import layouts
from harness.cases import Case, ParamSpec
from harness.layouts import DRAWN, LAYOUTS


def test_every_family_has_its_own_name_and_title() -> None:
    assert len({layout.name for layout in LAYOUTS}) == len({layout.title for layout in LAYOUTS}) == len(LAYOUTS)
    assert all(layouts.named(layout.name) is layout is layouts.named(layout.title) for layout in LAYOUTS)


def test_the_rank_side_has_a_builder_for_every_family_and_for_no_other() -> None:
    from harness.tasks.layouts import BUILDERS

    assert set(BUILDERS) == {layout.name for layout in LAYOUTS}
    assert all(callable(build) for build in BUILDERS.values())


@pytest.mark.parametrize("world", range(1, 9))
def test_a_case_on_a_family_reads_its_degrees_from_that_familys_mesh(world: int) -> None:
    for layout in DRAWN:
        mesh = layout.mesh(world)
        if mesh is None:
            continue
        assert len(mesh) == len(layout.dims), layout
        case = Case((ParamSpec("w0", (4, 4)),), world_size=world, mesh=mesh, layout=layout, reference=reference.Muon)
        assert case.layout is layout
        assert (case.tp, case.ep) == (mesh[-1] if "tp" in layout.dims else 1, mesh[0] if "ep" in layout.dims else 1)


def test_fsdp2_on_a_1d_mesh_is_titled_by_whether_the_case_holds_an_expert_stack() -> None:
    case = Case((ParamSpec("w0", (2, 4, 4)),), world_size=2, mesh=(2,), reference=reference.Muon)
    assert case.layout is layouts.EXPERTS
    assert replace(case, params=(ParamSpec("w0", (4, 4)),)).layout is layouts.FSDP
    assert (
        Case(case.params, world_size=2, mesh=(2,), layout=layouts.OWN, reference=reference.Muon).layout is layouts.OWN
    )


def test_a_case_whose_mesh_is_not_its_layouts_is_refused_naming_both() -> None:
    with pytest.raises(ValueError, match=r"Case layout=fsdp_tp runs on a mesh of dims \('dp', 'tp'\), not mesh=\[4\]"):
        Case((ParamSpec("w0", (4, 4)),), world_size=4, mesh=(4,), layout=layouts.FSDP_TP, reference=reference.Muon)
