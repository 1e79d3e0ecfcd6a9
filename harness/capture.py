"""Capturing a training job's sharding: what muongate needs to judge an optimizer on exactly the
parameters and placements of a user's own run, and nothing of the weights (issue #52).

In the user's job, on every rank, after the model is laid out and the optimizer built (under
torchrun or any launcher, any world size, NCCL or gloo)::

    from harness.capture import capture
    capture(model, optimizer, "layout.json")     # a collective: every rank calls it

Rank 0 writes one JSON file (``SCHEMA``, ``VERSION``): the job (world size, backend, torch and
muongate versions, the optimizer's class) and, per parameter the optimizer steps, in its order:
its name (from ``model.named_parameters``), global shape and dtype; its param group, the group's
algorithm (``muon`` or ``adamw`` where the group says ``use_muon``, else the optimizer's class)
and settings; and its layout: for a DTensor, the mesh (shape, dim names, the global ranks in
it) and placements, each dim's chunk (what ``torch.chunk`` pads a ``Shard`` to), and every
rank's local shape and global offset as that rank sees them; for a plain tensor, every rank's
local shape. ``load_capture`` reads it back, refusing a newer version or a broken file with one
line naming the file and what is wrong. A job with several optimizers (Muon for the matrices,
``torch.optim.AdamW`` for the rest) passes them all, ``capture(model, [muon, adamw], path)``:
one file, each parameter under the optimizer that steps it. ``python -m harness.capture FILE``
checks a file and says what it holds.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from reference import param_names

#: what the file says it is, and the version of its layout this muongate writes and reads
SCHEMA = "muongate.capture"
VERSION = 1
#: the keys of a param group that are not settings
_NOT_SETTINGS = frozenset({"params", "param_names"})


def _setting(value: Any) -> Any:
    """A param group's setting as JSON holds it: numbers, strings, booleans, lists; a dtype or
    anything else by its ``str``."""
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, tuple | list):
        return [_setting(v) for v in value]
    return str(value)


def _layout(p: torch.Tensor) -> dict[str, Any]:
    """This rank's view of ``p``'s layout: mesh and placements for a DTensor, else none."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not isinstance(p, DTensor):
        return {"local_shape": list(p.shape), "offset": [0] * p.ndim}
    mesh = p.device_mesh
    _, offset = compute_local_shape_and_global_offset(p.shape, mesh, p.placements)
    chunks = [
        math.ceil(p.shape[pl.dim] / mesh.size(d)) if isinstance(pl, Shard) and pl.dim < p.ndim else None
        for d, pl in enumerate(p.placements)
    ]
    return {
        "mesh": {
            "shape": list(mesh.shape),
            "dim_names": list(mesh.mesh_dim_names) if mesh.mesh_dim_names else None,
            "ranks": mesh.mesh.tolist(),
        },
        "placements": [repr(pl) for pl in p.placements],
        "chunks": chunks,
        "local_shape": list(p.to_local().shape),
        "offset": list(offset),
    }


def _names(model: nn.Module | None) -> dict[int, str]:
    return {} if model is None else {id(p): name for name, p in model.named_parameters(remove_duplicate=False)}


def _algorithm(group: Mapping[str, Any], optimizer: torch.optim.Optimizer) -> str:
    """What steps a group: a hybrid optimizer's group says which of its two (``use_muon``)."""
    if "use_muon" not in group:
        return type(optimizer).__name__
    return "muon" if group["use_muon"] else "adamw"


def _optimizers(optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer]) -> list[torch.optim.Optimizer]:
    return [optimizer] if isinstance(optimizer, torch.optim.Optimizer) else list(optimizer)


def describe_optimizer(
    model: nn.Module | None, optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer]
) -> list[dict[str, Any]]:
    """This rank's record of every parameter the optimizer (or each of several, in order: a job
    that steps its matrices with Muon and the rest with ``torch.optim.AdamW``) steps, in its order;
    the groups are numbered across the optimizers."""
    names = _names(model)
    params = []
    groups = [(group, opt) for opt in _optimizers(optimizer) for group in opt.param_groups]
    for gi, (group, opt) in enumerate(groups):
        given = param_names(group, gi)
        settings = {k: _setting(v) for k, v in group.items() if k not in _NOT_SETTINGS}
        algorithm = _algorithm(group, opt)
        for i, p in enumerate(group["params"]):
            name = names.get(id(p)) or given[i]
            params.append(
                {
                    "name": name,
                    "shape": list(p.shape),
                    "dtype": str(p.dtype).removeprefix("torch."),
                    "group": gi,
                    "algorithm": algorithm,
                    "settings": settings,
                    "layout": _layout(p),
                }
            )
    return params


def capture(
    model: nn.Module | None,
    optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
    path: str | Path,
    *,
    group: Any = None,
) -> dict[str, Any] | None:
    """Writes the job's layout to ``path`` on rank 0 and returns it there (``None`` on the other
    ranks). ``optimizer``: the job's optimizer, or every one of them (``[muon, adamw]``): one file
    of all the parameters they step. A collective over ``group`` (the default group): every rank
    must call it, and every rank returns once the file is written."""
    mine = describe_optimizer(model, optimizer)
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    everyone: list[Any] = [None] * world
    if world > 1:
        dist.all_gather_object(everyone, mine, group=group)
    else:
        everyone = [mine]
    counts = {len(ranks) for ranks in everyone}
    if len(counts) != 1:  # every rank sees it, and raises: none is left waiting below
        raise ValueError(f"capture: the ranks' optimizers step different numbers of parameters: {sorted(counts)}")
    if dist.is_initialized() and dist.get_rank(group) != 0:
        dist.barrier(group=group)  # returns once rank 0 has written the file
        return None
    params = []
    for i, first in enumerate(everyone[0]):
        entry = {k: v for k, v in first.items() if k != "layout"}
        layout = {k: v for k, v in first["layout"].items() if k not in ("local_shape", "offset")}
        layout["ranks"] = [{k: ranks[i]["layout"][k] for k in ("local_shape", "offset")} for ranks in everyone]
        params.append({**entry, "layout": layout})
    from harness import __version__

    record = {
        "schema": SCHEMA,
        "version": VERSION,
        "job": {
            "world_size": world,
            "backend": dist.get_backend(group) if dist.is_initialized() else None,
            "torch": torch.__version__,
            "muongate": __version__,
            "optimizer": ", ".join(f"{type(o).__module__}.{type(o).__qualname__}" for o in _optimizers(optimizer)),
        },
        "params": params,
    }
    Path(path).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    if world > 1:
        dist.barrier(group=group)
    return record


@dataclass(frozen=True)
class Capture:
    """A capture file, read and checked (``load_capture``)."""

    path: Path
    job: Mapping[str, Any]
    params: tuple[Mapping[str, Any], ...]

    def summary(self) -> str:
        layouts = sorted({" ".join(p["layout"].get("placements") or ["plain"]) for p in self.params})
        algorithms = sorted({str(p["algorithm"]) for p in self.params})
        n = len(self.params)
        return (
            f"{self.path}: {n} parameter{'' if n == 1 else 's'} of a {self.job['world_size']}-rank job "
            f"({self.job.get('backend')}, {self.job.get('optimizer')}); algorithms {', '.join(algorithms)}; "
            f"placements {'; '.join(layouts)}"
        )


class CaptureError(ValueError):
    """A capture file muongate cannot read; its message is one line naming the file."""


def load_capture(path: str | Path) -> Capture:
    """Reads and checks a capture file (``capture``); a newer version, another schema or a broken
    file is a ``CaptureError`` naming the file and what is wrong."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise CaptureError(f"{path}: cannot be read: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise CaptureError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise CaptureError(f"{path}: not a muongate capture (its schema is not {SCHEMA!r})")
    version = data.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise CaptureError(
            f"{path}: capture version {version!r}; this muongate reads version {VERSION} and older: upgrade muongate"
        )
    job, params = data.get("job"), data.get("params")
    if not isinstance(job, dict) or not isinstance(job.get("world_size"), int) or job["world_size"] < 1:
        raise CaptureError(f"{path}: its 'job' has no world_size of at least 1")
    if not isinstance(params, list):
        raise CaptureError(f"{path}: its 'params' is not a list")
    for i, p in enumerate(params):
        where = f"{path}: params[{i}]" + (f" ({p.get('name')!r})" if isinstance(p, dict) else "")
        missing = [
            k
            for k in ("name", "shape", "dtype", "group", "algorithm", "layout")
            if not isinstance(p, dict) or k not in p
        ]
        if missing:
            raise CaptureError(f"{where}: lacks {', '.join(missing)}")
        ranks = p["layout"].get("ranks") if isinstance(p["layout"], dict) else None
        if not isinstance(ranks, list) or len(ranks) != job["world_size"]:
            raise CaptureError(f"{where}: its layout does not give each of the {job['world_size']} ranks' local shape")
        for r, local in enumerate(ranks):
            shape = local.get("local_shape") if isinstance(local, dict) else None
            if not isinstance(shape, list) or len(shape) != len(p["shape"]):
                raise CaptureError(f"{where}: rank {r}'s local shape {shape!r} is not of the shape {p['shape']}'s rank")
    return Capture(path, job, tuple(params))


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m harness.capture",
        description="Checks a capture file (harness.capture.capture) and says what it holds; "
        "replay it with pytest -m gate --layout-from=FILE.",
    )
    parser.add_argument("file", help="a capture file written by harness.capture.capture")
    args = parser.parse_args(argv)
    try:
        print(load_capture(args.file).summary())
    except CaptureError as e:
        print(f"muongate: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
