"""Importing a plug-in named ``MODULE:NAME`` or ``path/to/file.py:NAME``, with errors that say
what was asked for.

A file is imported by its module name, with its directory (or, inside a package, the package's
root) appended to ``sys.path``: the ranks receive the plug-in by pickling, which names its
module, and multiprocessing hands each rank the ``sys.path`` of the process that starts it, so
that they import the same file by the same name. A torchrun rank or an xdist worker is a
pytest session of its own, which imports the file from the command line again.
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

#: the files of the import machinery itself, which no plug-in's error is about
_LOADERS = frozenset({Path(__file__).resolve(), Path(importlib.__file__ or "").resolve()})


class PluginImportError(ImportError):
    """The module of a plug-in does not import; the message is one line that says why and where."""


def load_object(spec: str) -> Any:
    """``'package.module:attr'`` (or ``'path/to/file.py:attr'``) → the object."""
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise ValueError(f"{spec!r} is not of the form MODULE:NAME")
    return getattr(import_module_of("", spec), attr)


def import_spec(option: str, spec: str, form: str = "MODULE:NAME") -> str:
    """Imports the module of ``--option spec`` and returns the spec by module name (``MODULE:NAME``),
    which the ranks can import; a spec without a colon is returned as it is, for the loader to judge.

    Raises ``PluginImportError`` with one line naming the file and line of a syntax error, the
    module a missing import was asked for by, or the path a missing module was looked for on."""
    module_part, colon, attr = spec.rpartition(":")
    if not colon or not module_part or not attr:
        return spec
    return f"{import_module_of(option, spec, form).__name__}:{attr}"


def is_file_spec(spec: str) -> bool:
    """Whether ``spec`` names its module by a file's path rather than a module name."""
    module_part = spec.rpartition(":")[0]
    return module_part.endswith(".py") or "/" in module_part or os.sep in module_part


def import_module_of(option: str, spec: str, form: str = "MODULE:NAME") -> ModuleType:
    """The module of ``spec`` (``MODULE:NAME`` or ``path/to/file.py:NAME``), imported; ``form``
    is what the option expects, for the error where the module is on no directory of the path."""
    said = f"--{option} {spec}: " if option else f"{spec}: "
    module_part = spec.rpartition(":")[0]
    if is_file_spec(spec):
        name, file = _module_of_file(said, module_part)
    else:
        name, file = module_part, None
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
            raise PluginImportError(said + _not_on_path(name, spec, form)) from e
        raise PluginImportError(said + _inner_import(e)) from e
    except SyntaxError as e:
        text = (e.text or "").strip()
        raise PluginImportError(
            f"{said}{e.filename} line {e.lineno}: SyntaxError: {e.msg}" + (f": {text}" if text else "")
        ) from e
    except ImportError as e:
        raise PluginImportError(said + _inner_import(e)) from e
    except Exception as e:  # whatever the module's top level raises is its author's to see, in one line
        raise PluginImportError(
            f"{said}importing {name} raised {type(e).__name__}: {_first_line(e)} ({_where(e)})"
        ) from e
    if file is not None and Path(getattr(module, "__file__", "") or "").resolve() != file:
        other = getattr(module, "__file__", None) or "a module without a file"
        raise PluginImportError(
            f"{said}the ranks import {file} by its module name {name}, which is {other} here; rename it"
        )
    return module


def _module_of_file(said: str, given: str) -> tuple[str, Path]:
    """The module name of the file ``given`` and its path; its directory, or the root of the
    package it is in, goes on ``sys.path`` (last, so that it shadows nothing already there)."""
    file = Path(given).expanduser().resolve()
    if not file.is_file():
        raise PluginImportError(f"{said}no such file {file}")
    if file.suffix != ".py":
        raise PluginImportError(f"{said}{file} is not a .py file; name a Python file, path/to/file.py:NAME")
    parts = [] if file.name == "__init__.py" else [file.stem]  # a package's own file is the package
    root = file.parent
    while (root / "__init__.py").is_file() and root.parent != root:
        parts.insert(0, root.name)
        root = root.parent
    if not all(part.isidentifier() for part in parts):
        raise PluginImportError(
            f"{said}the ranks import {file} by its module name, and {'.'.join(parts)} is not one; "
            "rename it to letters, digits and underscores (e.g. my_muon.py)"
        )
    if not any(_same_dir(entry, root) for entry in sys.path):
        sys.path.append(str(root))
        importlib.invalidate_caches()
    return ".".join(parts), file


def _same_dir(entry: str, directory: Path) -> bool:
    return Path(entry or os.getcwd()).resolve() == directory


def _not_on_path(name: str, spec: str, form: str) -> str:
    """Why ``name`` did not import: it is on none of the directories of ``sys.path``, and how to fix that."""
    path = ", ".join(entry or "'' (the current directory)" for entry in sys.path)
    file = name.replace(".", os.sep) + ".py"
    attr = spec.rpartition(":")[2]
    if Path(file).is_file() or Path(name.replace(".", os.sep), "__init__.py").is_file():
        fix = (
            f"it is in this directory, which is not on sys.path: run with PYTHONPATH=. or name the file: {file}:{attr}"
        )
    else:
        fix = f"run from the directory that holds it with PYTHONPATH=., or name its file: path/to/{file}:{attr}"
    return f"No module named {name!r} on sys.path ({path}); expected {form} importable from here: {fix}"


def _inner_import(e: ImportError) -> str:
    """An import that the module itself (or one it imports) asked for and that failed, with where."""
    if isinstance(e, ModuleNotFoundError) and e.name:
        return f"{_where(e)} imports {e.name}, which does not import here ({_first_line(e)})"
    return f"{_where(e)}: {type(e).__name__}: {_first_line(e)}"


def _where(e: BaseException) -> str:
    """The file and line that raised ``e``, and the plug-in's own line that led there where they differ."""
    frames = [
        f
        for f in traceback.extract_tb(e.__traceback__)
        if not f.filename.startswith("<") and Path(f.filename).resolve() not in _LOADERS
    ]
    if not frames:
        return "no file"
    last, first = frames[-1], frames[0]
    here = f"{last.filename} line {last.lineno}"
    return here if first is last else f"{here}, from {first.filename} line {first.lineno}"


def _first_line(e: BaseException) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return lines[0].strip() + (" …" if len(lines) > 1 else "") if lines else ""


def load_declared(option: str, spec: str) -> tuple[Any, dict[str, Any]]:
    """The callable ``spec`` names for ``--option``, and the ``muongate_conventions`` it declares."""
    obj = load_callable(option, spec)
    return obj, dict(getattr(obj, "muongate_conventions", {}))


def load_callable(option: str, spec: str) -> Any:
    """The callable ``spec`` names for ``--option``; one the ranks cannot receive (by pickling) is refused."""
    obj = load_object(spec)
    if not callable(obj):
        raise TypeError(f"--{option} {spec}: {obj!r} is not callable")
    try:
        pickle.dumps(obj)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        raise TypeError(
            f"--{option} {spec}: the ranks receive it by pickling, and it does not pickle ({e}); "
            "make it a function or class defined at the top level of its module"
        ) from e
    return obj
