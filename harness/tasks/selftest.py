"""Rank-side tasks used by the harness's own tests: one that works and one per way to fail."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from harness.ranks import RankContext


def sum_of_ranks(ctx: RankContext, payload: Any) -> float:
    """All-reduces each rank's number: proves the ranks share a real process group."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(ctx.rank)], device=ctx.device)
    dist.all_reduce(t, group=ctx.group)
    return float(t.item())


def raise_on_rank(ctx: RankContext, payload: int) -> int:
    """Rank ``payload`` raises before the collective its peers wait in."""
    import torch
    import torch.distributed as dist

    if ctx.rank == payload:
        raise ValueError(f"planted failure on rank {ctx.rank}")
    dist.all_reduce(torch.zeros(1, device=ctx.device), group=ctx.group)
    return ctx.rank


def hang_on_rank(ctx: RankContext, payload: int) -> int:
    """Rank ``payload`` sleeps far past any deadline."""
    if ctx.rank == payload:
        time.sleep(3600)
    return ctx.rank


def compute_on_rank(ctx: RankContext, payload: tuple[int, float]) -> int:
    """Rank ``payload[0]`` computes for ``payload[1]`` seconds (as a first compile does), while
    its peers wait for it in a collective."""
    import torch
    import torch.distributed as dist

    rank, seconds = payload
    if ctx.rank == rank:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            sum(i * i for i in range(10_000))
    dist.all_reduce(torch.zeros(1, device=ctx.device), group=ctx.group)
    return ctx.rank


def die_on_rank(ctx: RankContext, payload: int) -> int:
    """Rank ``payload`` is killed by SIGABRT, as gloo does on a size-mismatched collective."""
    if ctx.rank == payload:
        os.kill(os.getpid(), signal.SIGABRT)
        time.sleep(10)
    return ctx.rank


def checkpoint_then_die(ctx: RankContext, payload: int) -> str:
    """Writes a case checkpoint's directory (``checkpoint_dir``), then rank ``payload`` dies
    before anyone removes it. Returns the directory."""
    from harness.tasks.checkpoint import checkpoint_dir

    path = checkpoint_dir(ctx, 0)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, f"{ctx.rank}.distcp"), "w") as f:
        f.write("saved")
    die_on_rank(ctx, payload)
    return path


def pid(ctx: RankContext, payload: Any) -> int:
    return os.getpid()


def sharded_muon_errors(ctx: RankContext, payload: Any) -> list[str]:
    """Builds ShardedMuon from bad inputs; returns each error's type and message."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Partial, Shard, distribute_tensor

    from distributed_impl import ShardedMuon

    mesh = DeviceMesh.from_group(ctx.group, "cpu")
    good = torch.nn.Parameter(distribute_tensor(torch.zeros(6, 4), mesh, [Shard(0)]))
    bad_inputs = [
        [{"params": [good, torch.nn.Parameter(torch.zeros(3, 3))], "param_names": ["good", "plain"]}],
        [
            {
                "params": [torch.nn.Parameter(DTensor.from_local(torch.zeros(6, 4), mesh, [Partial()]))],
                "param_names": ["partial"],
            }
        ],
        [
            {
                "params": [torch.nn.Parameter(distribute_tensor(torch.zeros(8), mesh, [Shard(0)]))],
                "param_names": ["bias"],
            }
        ],
    ]
    errors = []
    for groups in bad_inputs:
        try:
            ShardedMuon(groups)
            errors.append("no error")
        except (TypeError, ValueError) as e:
            errors.append(f"{type(e).__name__}: {e}")
    return errors


def layout_placements(ctx: RankContext, case: Any) -> dict[str, str]:
    """The placements each parameter of a layout case gets on this rank, built as the
    optimizer task builds them."""
    import torch

    from harness.tasks.common import mesh_for
    from harness.tasks.layouts import build_model, case_param

    tensors = [torch.zeros(s.shape, dtype=getattr(torch, s.dtype)) for s in case.params]
    model = build_model(case, tensors, mesh_for(ctx, case.mesh, layout=case.layout))
    return {s.name: str(tuple(getattr(case_param(model, s.name), "placements", ()))) for s in case.params}


def owner_split_work(ctx: RankContext, case: Any) -> int:
    """How many matrices (experts counted one by one) this rank orthogonalizes in one
    ``owner_split`` step of ``ShardedMuon`` on the case's layout."""
    import torch

    from distributed_impl import ShardedMuon
    from harness.tasks.common import mesh_for
    from harness.tasks.layouts import build_model, case_param
    from reference import orthogonalize

    done = 0

    def counting(m: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        nonlocal done
        done += m.shape[0] if m.ndim == 3 else 1
        return orthogonalize(m, *args, **kwargs)

    tensors = [torch.randn(s.shape) for s in case.params]
    model = build_model(case, tensors, mesh_for(ctx, case.mesh, layout=case.layout))
    params = [case_param(model, s.name) for s in case.params]
    for p in params:
        p.grad = torch.ones_like(p)
    ShardedMuon([{"params": params, "use_muon": True}], mode="owner_split", orthogonalize_fn=counting).step()
    return done


def debug_level(ctx: RankContext, payload: Any) -> str:
    """The C++ side's debug level: proves a case's ``env`` reached torch.distributed."""
    import torch.distributed as dist

    return str(dist.get_debug_level())


def raise_on_every_rank(ctx: RankContext, payload: Any) -> int:
    """Every rank raises with its own message."""
    raise ValueError(f"planted failure on rank {ctx.rank}")


def raise_past_an_unmatched_collective(ctx: RankContext, payload: Any) -> int:
    """Rank 0 starts an asynchronous all-reduce no peer ever joins; every rank then raises."""
    import torch
    import torch.distributed as dist

    if ctx.rank == 0:
        dist.all_reduce(torch.full((4,), 7.0), group=ctx.group, async_op=True)
    raise ValueError(f"planted failure on rank {ctx.rank}, past an unmatched all-reduce")


def switches_then_set(ctx: RankContext, switches: Any) -> Any:
    """The process's arithmetic switches as the case found them; then sets ``switches`` and leaves them."""
    from harness.ranks.switches import Switches

    found = Switches.now()
    switches.use()
    return found


def subgroup_busy_while_others_wait(ctx: RankContext, payload: tuple[int, int]) -> int:
    """On the ``(2, w // 2)`` grid: the second row all-reduces ``numel`` floats ``reps`` times
    over its own row's group while the first row already waits in an all-reduce over the
    columns, which the second row joins last. A correct task: every collective can complete."""
    import torch
    import torch.distributed as dist

    numel, reps = payload
    columns, row = ctx.grid_groups[(2, ctx.world_size // 2)]
    if ctx.rank >= ctx.world_size // 2:
        t = torch.ones(numel, device=ctx.device)
        for _ in range(reps):
            dist.all_reduce(t, group=row)
    dist.all_reduce(torch.ones(1, device=ctx.device), group=columns)
    return ctx.rank


def subgroups_cross(ctx: RankContext, payload: Any) -> int:
    """On the ``(2, w // 2)`` grid: ranks on a checkerboard's black squares wait over their
    column, the others over their row, so every group has a member waiting in another: a deadlock."""
    import torch
    import torch.distributed as dist

    columns, row = ctx.grid_groups[(2, ctx.world_size // 2)]
    where, across = divmod(ctx.rank, ctx.world_size // 2)
    if (where + across) % 2 == 0:
        dist.all_reduce(torch.ones(1, device=ctx.device), group=columns)
    else:
        dist.all_reduce(torch.ones(1, device=ctx.device), group=row)
    return ctx.rank


def layout_capture(ctx: RankContext, payload: tuple[Any, str]) -> bool:
    """A layout case built as the optimizer task builds it, its Muon and AdamW groups given to an
    optimizer, and the whole captured (``harness.capture``) to the file ``payload`` names."""
    import torch

    from harness.capture import capture
    from harness.tasks.common import mesh_for, param_groups
    from harness.tasks.layouts import build_model, case_param

    case, path = payload
    tensors = [torch.zeros(s.shape, dtype=getattr(torch, s.dtype)) for s in case.params]
    model = build_model(case, tensors, mesh_for(ctx, case.mesh, layout=case.layout))
    groups = param_groups((s.name, case_param(model, s.name), s.use_muon) for s in case.params)
    capture(model, torch.optim.SGD(groups, lr=0.1), path, group=ctx.group)
    return True


def two_optimizer_capture(ctx: RankContext, path: str) -> bool:
    """A job of two optimizers, as users write one: an FSDP2 model whose hidden matrices
    ``ShardedMuon`` steps and whose embedding and norm ``torch.optim.AdamW`` steps, both captured
    into one file (``harness.capture``, a list of optimizers)."""
    import torch
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    from distributed_impl import ShardedMuon
    from harness.capture import capture

    torch.manual_seed(0)
    embed, hidden, norm = nn.Embedding(11, 6), nn.Linear(6, 5, bias=False), nn.LayerNorm(5)
    model = nn.Sequential(embed, hidden, norm)
    fully_shard(model, mesh=DeviceMesh.from_group(ctx.group, "cpu", mesh_dim_names=("dp",)))
    muon = ShardedMuon([hidden.weight], lr=0.05)
    adamw = torch.optim.AdamW([embed.weight, *norm.parameters()], lr=0.003, weight_decay=0.0)
    capture(model, [muon, adamw], path, group=ctx.group)
    return True


def relay_with_a_planted_fault(ctx: RankContext, fault: str) -> dict[str, str | None]:
    """The relay check (``harness.tasks.relay``) run on a relay with ``fault`` planted: one that
    all-reduces in bf16 (``"bf16 all_reduce"``), or never writes the results back
    (``"no copy back"``). Needs the whole pool."""
    import dataclasses

    import torch
    import torch.distributed as dist

    from harness.ranks.relay import Relay, _Done, _host
    from harness.tasks.relay import against_gloo

    class Planted(Relay):
        def allreduce(self, tensors: list[Any], opts: Any = None) -> Any:  # type: ignore[override]
            if fault != "bf16 all_reduce":
                return super().allreduce(tensors, opts)

            def narrow(hosts: list[Any]) -> Any:
                low = [h.to(torch.bfloat16) for h in hosts]
                work = self._gloo.allreduce(low, opts)
                work.wait()
                for h, lo in zip(hosts, low, strict=True):
                    h.copy_(lo)
                return work

            return self._relay(tensors, narrow)

        def _relay(self, outputs: list[Any], call: Any) -> Any:
            if fault != "no copy back":
                return super()._relay(outputs, call)
            call([[_host(t) for t in o] if isinstance(o, list) else _host(o) for o in outputs]).wait()
            return _Done(outputs)

    name = "planted_" + "".join(c if c.isalnum() else "_" for c in fault)
    if name not in dist.Backend.backend_list:
        dist.Backend.register_backend(
            name,
            lambda o, _: Planted(o.store, o.group_rank, o.group_size, o.timeout, o.group_id),
            extended_api=True,
            devices=["cpu", "cuda"],
        )
    planted = dist.new_group(list(range(ctx.world_size)), backend=name)
    return against_gloo(dataclasses.replace(ctx, group=planted, grid_groups={}), None)
