"""Ranks on one GPU, second sitting (issue #52, item 4): a process group written in Python that
relays every collective through a gloo group of its own on CPU copies (the CPU for
communication, the GPU for compute), registered by name so that functional collectives,
DTensor and FSDP2 find it. Each stage prints ``ok`` or its error; a watchdog dumps the stacks
after 60 s. Research, not a gate: it uses private parts of torch (``_register_process_group``
and ``distributed_c10d._world``). See docs/pages/torchrun-gpus.md.

Run: ``python examples/one_gpu_relay_probe.py cuda 2`` (two ranks sharing ``cuda:0``), ``cuda 4``
(also a 2×2 mesh and HSDP), or ``cpu 2`` / ``cpu 4`` (the mechanism alone, copies being no-ops).
"""

import datetime
import faulthandler
import sys
import time
import traceback

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, Work


class Done(Work):
    def __init__(self, result):
        super().__init__()
        self._fut = torch.futures.Future()
        self._fut.set_result(result)

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def get_future(self):
        return self._fut


def host(t):
    return t.detach().to("cpu", copy=True)


class Relay(dist.ProcessGroup):
    def __init__(self, store, name, rank, size):
        super().__init__(rank, size)
        self.name_ = name
        self.gloo = ProcessGroupGloo(PrefixStore(name, store), rank, size, datetime.timedelta(seconds=60))

    def getBackendName(self):
        return "relay"

    def getGroupName(self):
        return self.name_

    def getGroupDesc(self):
        return self.name_

    @property
    def group_name(self):
        return self.name_

    def _each(self, outs, call):
        """``call`` on CPU copies of the tensors ``outs`` (a list, or a list of lists), waited for,
        then each result copied back in place."""
        flat = [t for o in outs for t in (o if isinstance(o, list) else [o])]
        hosts = [host(t) for t in flat]
        nested, i = [], 0
        for o in outs:  # the copies in the shape of ``outs``
            n = len(o) if isinstance(o, list) else 1
            nested.append(hosts[i : i + n] if isinstance(o, list) else hosts[i])
            i += n
        call(nested).wait()
        for t, h in zip(flat, hosts, strict=True):
            t.copy_(h)
        return Done(outs)

    def allreduce(self, tensors, opts=None):
        return self._each(tensors, lambda h: self.gloo.allreduce(h, opts))

    def allreduce_coalesced(self, tensors, opts=None):
        return self._each(tensors, lambda h: self.gloo.allreduce_coalesced(h, opts))

    def broadcast(self, tensors, opts=None):
        return self._each(tensors, lambda h: self.gloo.broadcast(h, opts))

    def barrier(self, opts=None):
        self.gloo.barrier(opts).wait()
        return Done([])

    def allgather(self, outputs, inputs, opts=None):
        return self._each(outputs, lambda h: self.gloo.allgather(h, [host(t) for t in inputs], opts))

    def gather(self, outputs, inputs, opts=None):
        return self._each(outputs, lambda h: self.gloo.gather(h, [host(t) for t in inputs], opts))

    def reduce_scatter(self, outputs, inputs, opts=None):
        return self._each(outputs, lambda h: self.gloo.reduce_scatter(h, [[host(t) for t in i] for i in inputs], opts))

    def scatter(self, outputs, inputs, opts=None):
        return self._each(outputs, lambda h: self.gloo.scatter(h, [[host(t) for t in i] for i in inputs], opts))

    def _gather_one(self, output, input, opts=None):
        return self._each([output], lambda h: self.gloo._allgather_base(h[0], host(input), opts))

    def _scatter_one(self, output, input, opts=None):
        return self._each([output], lambda h: self.gloo._reduce_scatter_base(h[0], host(input), opts))

    def _to_all(self, output, input, out_splits, in_splits, opts=None):
        return self._each([output], lambda h: self.gloo.alltoall_base(h[0], host(input), out_splits, in_splits, opts))

    def _gather_many(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs, strict=True):
            self._gather_one(o, i, opts)
        return Done(outputs)

    def _scatter_many(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs, strict=True):
            self._scatter_one(o, i, opts)
        return Done(outputs)

    _allgather_base = all_gather_single = _gather_one
    allgather_into_tensor_coalesced = all_gather_single_coalesced = _gather_many
    _reduce_scatter_base = reduce_scatter_single = _scatter_one
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced = _scatter_many
    alltoall_base = all_to_all_single = _to_all


def install(pg, ranks, default=False):
    """Register a relay by name, as init_process_group and new_group would (private maps)."""
    w = dist.distributed_c10d._world
    torch._C._distributed_c10d._register_process_group(pg.name_, pg)
    w.pg_map[pg] = ("relay", None)
    w.pg_names[pg] = pg.name_
    w.pg_group_ranks[pg] = {g: i for i, g in enumerate(ranks)}
    w.pg_backend_config[pg] = "relay"
    if default:
        w.default_pg = pg


def stage(rank, name, fn):
    t = time.time()
    try:
        out = fn()
        print(f"rank {rank} {name}: ok {time.time() - t:.2f} s {out if out is not None else ''}", flush=True)
    except Exception as e:
        traceback.print_exc() if rank == 0 else None
        print(f"rank {rank} {name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)


def main(rank, world, dev, port):
    faulthandler.dump_traceback_later(60, exit=True)
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor

    store = dist.TCPStore("127.0.0.1", port, world, rank == 0)
    dist.init_process_group("gloo", store=PrefixStore("default", store), rank=rank, world_size=world)
    relay = Relay(store, "relay", rank, world)
    install(relay, list(range(world)), default=True)
    d = torch.device("cuda:0" if dev == "cuda" else "cpu")
    x = torch.arange(12.0, device=d).reshape(4, 3) + rank
    torch.manual_seed(0)
    full = torch.randn(7, 5, device=d)

    def c10d():
        y = torch.empty(4 * world, 3, device=d)
        dist.all_gather_into_tensor(y, x)
        return y.sum().item()

    stage(rank, "c10d all_gather_into_tensor", c10d)
    stage(rank, "funcol all_gather_tensor", lambda: funcol.all_gather_tensor(x, 0, relay).sum().item())
    stage(rank, "funcol all_reduce", lambda: funcol.all_reduce(x, "sum", relay).sum().item())
    stage(rank, "funcol reduce_scatter_tensor", lambda: funcol.reduce_scatter_tensor(x, "sum", 0, relay).sum().item())
    mesh = DeviceMesh.from_group(relay, d.type)

    def dtensor():
        dt = distribute_tensor(full, mesh, [Shard(0)])
        return (torch.equal(dt.full_tensor(), full), torch.equal(dt.redistribute(mesh, [Shard(1)]).full_tensor(), full))

    stage(rank, "DTensor distribute/full_tensor/redistribute", dtensor)

    def fsdp(on):
        m = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Linear(6, 2)).to(d)
        fully_shard(m, mesh=on)
        m(torch.randn(3, 5, device=d)).sum().backward()
        return [tuple(p.grad.to_local().shape) for p in m.parameters()]

    stage(rank, "FSDP2 forward and backward", lambda: fsdp(mesh))
    if world == 4:
        grid = torch.arange(4).reshape(2, 2)
        dims = []
        for dim in range(2):
            lines = grid.t() if dim == 0 else grid
            for line in lines.tolist():
                if rank in line:
                    g = Relay(store, f"relay-d{dim}-" + "-".join(map(str, line)), line.index(rank), 2)
                    install(g, line)
                    dims.append(g)
        mesh2 = DeviceMesh.from_group(dims, d.type, mesh=grid, mesh_dim_names=("dp", "tp"))
        big = torch.randn(9, 7, device=d)

        def dtensor2():
            from torch.distributed.tensor import Replicate

            dt = distribute_tensor(big, mesh2, [Shard(0), Shard(1)])
            same = torch.equal(dt.full_tensor(), big)
            moved = torch.equal(dt.redistribute(mesh2, [Replicate(), Shard(0)]).full_tensor(), big)
            prod = (
                ((dt @ dt.redistribute(mesh2, [Replicate(), Replicate()]).t()).full_tensor() - big @ big.t())
                .abs()
                .max()
                .item()
            )
            return (same, moved, f"matmul max|diff| {prod:.1e}", tuple(dt.to_local().shape))

        stage(rank, "DTensor on a 2x2 mesh: full_tensor, redistribute, matmul", dtensor2)

        stage(rank, "HSDP (FSDP2 on the 2x2 mesh) forward and backward", lambda: fsdp(mesh2))
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    print("torch", torch.__version__, "device", dev, flush=True)
    world = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    mp.spawn(main, args=(world, dev, 29611), nprocs=world)
