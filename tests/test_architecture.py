"""Claims about the shape of the code: imports flow one way and never in a circle.

``gates → harness → {reference, distributed_impl}``; ``reports`` reads records and imports
none of the others; ``reference`` imports only torch. Every ``import`` counts, those inside
functions too: a deferred import still makes one module depend on another; and so does a
string that names a module of ours, which ``importlib`` or a preload imports later.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from support import REPO

PACKAGES = ("harness", "reference", "distributed_impl", "reports", "gates")
#: package → the other packages it may import
ALLOWED = {
    "gates": {"harness", "reference", "distributed_impl", "reports"},
    "harness": {"reference", "distributed_impl", "reports"},
    "distributed_impl": {"reference"},
    "reference": set(),
    "reports": set(),
}


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for package in PACKAGES for p in (REPO / package).rglob("*.py")}


def _resolve(name: str) -> str | None:
    """The module of ours that ``import name`` loads (a package means its ``__init__``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> set[str]:
    return _imported(MODULES[module].read_text(encoding="utf-8")) - {module}


def _imported(source: str) -> set[str]:
    """What ``source`` imports: its import statements, and every string that names a module of
    ours whole (``"harness.tasks.optimizer"`` handed to ``importlib`` or to a forkserver's
    preload is an import that only runs later)."""
    tree = ast.parse(source)
    found: set[str | None] = set()
    # a command line for another process (a list with an option in it: ``["-p", "harness.plugin"]``)
    # names what that process loads, not an import of this one
    commands = {
        id(e)
        for node in ast.walk(tree)
        if isinstance(node, (ast.List, ast.Tuple))
        and any(isinstance(e, ast.Constant) and str(e.value).startswith("-") for e in node.elts)
        for e in node.elts
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {_resolve(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {_resolve(f"{node.module}.{alias.name}") for alias in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in commands:
            named = node.value.partition(":")[0]  # MODULE:NAME names its module too
            if "." in named and named in MODULES:
                found.add(named)
    return {m for m in found if m is not None}


#: imports by name that cross a wall, each a debt of issue #64 with what it is: the tests below
#: hold every other edge, and a debt paid must leave this list (``test_each_debt_is_still_owed``)
STRING_DEBTS = {
    (
        "harness.algorithms",
        "gates.examples.torch_adam",
    ): "FAMILIES names AdamW's shipped candidate, which lives in gates",
}
OWED = {module: _imports(module) for module in MODULES}
GRAPH = {module: deps - {d for (m, d) in STRING_DEBTS if m == module} for module, deps in OWED.items()}


def test_a_string_that_names_a_module_is_an_import() -> None:
    """The negative control of the string reading: a pool that preloads a task by name imports it."""
    planted = 'PRELOAD = ["torch", "harness.tasks.optimizer"]\nSPEC = "harness.tasks.selftest:sum_of_ranks"'
    assert _imported(planted) == {"harness.tasks.optimizer", "harness.tasks.selftest"}
    assert _imported('ARGS = ["-p", "harness.plugin"]') == set(), "a command line for another process"


@pytest.mark.parametrize(("module", "named"), sorted(STRING_DEBTS))
def test_each_debt_is_still_owed(module: str, named: str) -> None:
    assert named in OWED[module], f"{module} no longer names {named}: remove it from STRING_DEBTS"


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_imports_only_what_sits_below_it(package: str) -> None:
    wrong = sorted(
        f"{m} imports {dep}"
        for m, deps in GRAPH.items()
        if m.split(".")[0] == package
        for dep in deps
        if dep.split(".")[0] != package and dep.split(".")[0] not in ALLOWED[package]
    )
    assert not wrong, wrong


def test_no_module_imports_itself_through_a_circle() -> None:
    # A package's __init__ re-exporting its own modules is not a circle unless a module
    # imports the package back; the graph has both edges, so a real circle shows.
    circles = []
    for start in GRAPH:
        stack, seen = [(start, (start,))], set()
        while stack:
            node, path = stack.pop()
            for dep in GRAPH[node]:
                if dep == start:
                    circles.append(" → ".join((*path, start)))
                elif dep not in seen:
                    seen.add(dep)
                    stack.append((dep, (*path, dep)))
    assert not circles, sorted(set(circles))[:5]


def test_reference_imports_only_torch_and_the_standard_library() -> None:
    for module in (m for m in MODULES if m.startswith("reference")):
        tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top in {"torch", "reference"} or top in sys.stdlib_module_names, f"{module}: {name}"


#: the modules but ``harness/layouts.py`` that may write a layout's name out, and why
SPELLED_ELSEWHERE = {
    "reports/summary.py": "reports imports nothing of harness: its LAYOUT_ORDER orders the titles records "
    "carry, held equal to harness.layouts by test_reports_order_layouts_as_the_layout_module_lists_them",
    "distributed_impl/muon.py": "ShardedMuon's declaration, in the words users write (it imports no harness)",
}


def _spelled(path: Path, names: set[str]) -> list[str]:
    """The lines of ``path`` whose string literals (docstrings left out: they explain) hold one of ``names``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
        if any(name in node.value for name in names)
    ]


def test_layout_names_are_spelled_only_in_the_layout_module() -> None:
    from harness.layouts import LAYOUTS

    # the names no other word contains (``tp`` or ``own`` alone would match everywhere)
    names = {n for layout in LAYOUTS for n in (layout.name, layout.title) if "_" in n or "×" in n}
    assert names == {"fsdp_tp", "hsdp_tp", "ep_efsdp", "fsdp×tp", "hsdp×tp", "ep×efsdp"}
    spelled = [
        line
        for package in ("harness", "gates", "reports", "distributed_impl")
        for path in sorted((REPO / package).rglob("*.py"))
        if path != REPO / "harness" / "layouts.py"
        for line in _spelled(path, names)
        if str(path.relative_to(REPO)) not in SPELLED_ELSEWHERE
    ]
    assert not spelled, spelled


def test_reports_order_layouts_as_the_layout_module_lists_them() -> None:
    from harness.layouts import LAYOUTS
    from reports.summary import LAYOUT_ORDER

    assert tuple(layout.title for layout in LAYOUTS) == LAYOUT_ORDER


def test_cases_import_nothing_of_the_candidates() -> None:
    # a case is its data: how a candidate lays itself out is the runner's adaptation's to read
    wrong = sorted(
        f"{m} imports {dep}"
        for m, deps in GRAPH.items()
        if m.startswith("harness.cases")
        for dep in deps
        if dep.startswith("harness.candidates")
    )
    assert not wrong, wrong


#: the rooms inside ``harness`` that must not reach into others, and why
WALLS = {
    "harness.ranks": (
        {"harness"},
        "the pool runs any task it is given by reference and knows none by name: it imports nothing else of harness",
    ),
    "harness.cases": (
        {"harness.candidates", "harness.runner", "harness.tasks", "harness.plugin", "harness.session"},
        "a case is its data: it knows no candidate, no runner and no session",
    ),
    "harness.layouts": (
        {"harness"},
        "a layout is a mesh and its builder, read by cases, tasks and runner alike",
    ),
    "harness.verdicts.compare": ({"harness"}, "comparing two tensors knows no case, candidate or rank"),
    "harness.algorithms": (
        {"harness.cases", "harness.runner", "harness.tasks", "harness.plugin", "harness.session"},
        "what a reference declares is read from the reference alone",
    ),
}


def test_the_plugin_is_thin_its_session_object_holds_the_rest() -> None:
    """``harness.plugin`` is options, markers and fixtures: of harness it imports only its options,
    its session object (``GateSession``, which owns the plug-ins and the runner), where the ranks
    run (``devices``: is this a torchrun rank), the hypothesis profiles (``profiles``) and the
    plug-ins an option registers beside it, each a room of its own (``accepted``: ``--accept``). The verdict (exit status and report) is a
    room of its own too, which the session makes and no other room reaches."""
    assert GRAPH["harness.plugin"] == {
        "harness.plugin.options",
        "harness.plugin.gate_session",
        "harness.plugin.devices",
        "harness.plugin.profiles",
        "harness.plugin.accepted",
    }
    assert GRAPH["harness.plugin.gate_session"] & {"reports.terminal", "reports.diff", "reports.markdown"} == set()
    # which family a session judges against is the family registry's rule (``judged_family``),
    # and loading the plug-ins is ``harness.plugin.resolve``'s: the session object decides neither
    assert GRAPH["harness.plugin.gate_session"] & {"harness.algorithms", "harness.candidates"} == set()
    reaching = {m for m, deps in GRAPH.items() if "harness.plugin.verdict" in deps}
    assert reaching == {"harness.plugin.gate_session"}, reaching


def _breaches(graph: dict[str, set[str]], room: str) -> list[str]:
    """The imports by ``room``'s modules of modules past its walls (``WALLS``)."""
    walled, _ = WALLS[room]

    def inside(module: str, of: str) -> bool:
        return module == of or module.startswith(of + ".")

    return sorted(
        f"{m} imports {dep}"
        for m, deps in graph.items()
        if inside(m, room)
        for dep in deps
        if not inside(dep, room) and any(inside(dep, w) for w in walled)
    )


@pytest.mark.parametrize("room", sorted(WALLS))
def test_rooms_inside_harness_do_not_reach_past_their_walls(room: str) -> None:
    wrong = _breaches(GRAPH, room)
    assert not wrong, f"{room}: {WALLS[room][1]}; {wrong}"


def test_the_walls_catch_a_pool_that_imports_a_task_and_a_case_that_imports_a_candidate() -> None:
    planted = {
        **GRAPH,
        "harness.ranks.pool": GRAPH["harness.ranks.pool"] | {"harness.tasks.optimizer"},
        "harness.cases.case": GRAPH["harness.cases.case"] | {"harness.candidates.impl"},
    }
    assert _breaches(planted, "harness.ranks") == ["harness.ranks.pool imports harness.tasks.optimizer"]
    assert _breaches(planted, "harness.cases") == ["harness.cases.case imports harness.candidates.impl"]


def test_no_test_of_the_harness_is_a_gate(request: pytest.FixtureRequest) -> None:
    """The main job (``-m gate``) does not collect ``tests/`` (conftest.py): a gate written there
    would never run in it. Every test of ``tests/`` this session collected is checked."""
    from harness.plugin.gate_session import is_gate

    ours = [item for item in request.session.items if (REPO / "tests") in item.path.parents]
    assert ours, "this session collected no test of tests/"
    assert [item.nodeid for item in ours if is_gate(item)] == []
