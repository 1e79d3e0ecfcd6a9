"""Checkpoints as users take them: DCP's state-dict API (``get_model_state_dict``,
``get_optimizer_state_dict``), ``dcp.save`` and ``dcp.load``, into one directory per case.

One thing differs from the bare recipe, on purpose: a parameter the checkpoint holds no
optimizer state for has none after loading. DCP's ``get_optimizer_state_dict`` on a fresh
optimizer steps it once at lr 0 on zero gradients, which gives every parameter state (an
AdamW ``step`` of 1) that nothing in the checkpoint overwrites
(``examples/findings/dcp_state_dict_steps_stateless_parameters.py``); the gates judge the
optimizer, not that.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from harness.ranks import RankContext
from harness.ranks.pool import MEMORY_SCRATCH, SCRATCH

#: a checkpoint goes to the pool's memory scratch only where that has this many times the
#: parameters' bytes free (each parameter and up to three optimizer states, twice over)
_ROOM = 8


def checkpoint_dir(ctx: RankContext, params_bytes: int) -> str:
    """One directory for the whole case, named by rank 0: ranks of different torchrun nodes
    have different parents. Across hosts it must be shared storage (MUONGATE_CHECKPOINT_DIR).
    Otherwise it lies in the pool's scratch, which goes with the pool even where a failing rank
    never reached ``remove_checkpoint``: its scratch in memory where that has room for a
    checkpoint of parameters of ``params_bytes`` in all (DCP's default writer syncs every file
    it writes, a few milliseconds a checkpoint on a disk; the 2 checkpoint gates on 2 cores took
    1.4 s less of 16.8), else the one on disk."""
    parent = os.environ.get("MUONGATE_CHECKPOINT_DIR") or _scratch(params_bytes) or tempfile.gettempdir()
    chosen = [os.path.join(parent, f"muongate-ckpt-{uuid.uuid4().hex}")]
    dist.broadcast_object_list(chosen, src=dist.get_global_rank(ctx.group, 0), group=ctx.group)
    return chosen[0]


def _scratch(params_bytes: int) -> str | None:
    memory = os.environ.get(MEMORY_SCRATCH)
    if memory and os.path.isdir(memory) and shutil.disk_usage(memory).free >= _ROOM * params_bytes:
        return memory
    return os.environ.get(SCRATCH)


def params_bytes(tensors: Any) -> int:
    """The bytes of ``tensors`` whole (a DTensor counts its global shape)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def remove_checkpoint(ctx: RankContext, path: str, group: Any = None) -> None:
    """Removes ``checkpoint_dir``'s directory once every rank that reads it (``group``'s; by default
    the case's) is done with it. Ranks outside ``group`` do not call it."""
    dist.barrier(group=ctx.group if group is None else group)
    if ctx.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def dcp_save(model: nn.Module, opt: torch.optim.Optimizer, path: str, group: Any) -> None:
    """Model and optimizer state through DCP's state-dict API, saved by ``group``'s ranks."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    saved = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
    dcp.save(saved, checkpoint_id=path, process_group=group)


def dcp_load(model: nn.Module, opt: torch.optim.Optimizer, path: str, group: Any) -> None:
    """What ``dcp_save`` wrote, loaded into ``model`` and ``opt`` (their own layout) by ``group``'s ranks."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    state: dict[str, Any] = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
    # A parameter that never had a gradient has no optimizer state in the checkpoint, while
    # DCP's state-dict API initializes state for every parameter of the fresh optimizer: that
    # state is dropped again below (see the module docstring).
    dcp.load(state, checkpoint_id=path, planner=DefaultLoadPlanner(allow_partial_load=True), process_group=group)
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, opt, state["optim"])
    saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    held = [key.removeprefix("optim.state.") for key in saved if key.startswith("optim.state.")]
    for name, p in model.named_parameters():
        if not any(key.startswith(f"{name}.") for key in held):
            opt.state.pop(p, None)
