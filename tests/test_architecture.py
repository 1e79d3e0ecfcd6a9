"""Claims about the shape of the code: imports flow one way and never in a circle.

``gates → harness → {reference, distributed_impl}``; ``reports`` reads records and imports
none of the others; ``reference`` imports only torch. Every ``import`` counts, those inside
functions too: a deferred import still makes one module depend on another.
"""

from __future__ import annotations

import ast
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
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    found: set[str | None] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {_resolve(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {_resolve(f"{node.module}.{alias.name}") for alias in node.names}
    return {m for m in found if m is not None and m != module}


GRAPH = {module: _imports(module) for module in MODULES}


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
                assert top in {"torch", "reference", "__future__", "math", "collections", "typing"}, f"{module}: {name}"
