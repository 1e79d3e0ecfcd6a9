"""Importing a plug-in named ``MODULE:NAME``, with errors that say what was asked for."""

from __future__ import annotations

import importlib
import pickle
from typing import Any


def load_object(spec: str) -> Any:
    """``'package.module:attr'`` → the object."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{spec!r} is not of the form MODULE:NAME")
    return getattr(importlib.import_module(module_name), attr)


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
