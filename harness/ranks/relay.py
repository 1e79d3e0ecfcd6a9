# torch's stubs type ProcessGroup's methods as its C++ binding calls them, not as its C++ side
# calls a Python group back (callback names, lists of tensors, an options object): overriding
# them is what the relay is.
# mypy: disable-error-code="override, assignment, call-arg"
"""Ranks that share a GPU: a process group that relays every collective through gloo on the CPU.

NCCL refuses two ranks on one GPU, and gloo's functional collectives crash on CUDA tensors
(``docs/pages/torchrun-gpus.md``), so DTensor cannot run there over plain gloo. ``Relay`` is a
process group written in Python: each collective copies its tensors to the CPU, runs the same
collective on a gloo group of its own over those copies, and copies the results back where
they came from. The arithmetic stays on the tensors' device; only bytes travel through the
CPU, and the reductions are gloo's own on the CPU, as in the CPU gates.

It is registered as a torch backend (``BACKEND``) through ``torch.distributed.Backend.
register_backend``, so ``init_process_group`` and ``new_group`` make and name every group as
they do for gloo, and the functional collectives, DTensor and FSDP2 find them by name. On the
CPU the copies are real copies too, so the relay's code is tested there against plain gloo
(``tests/test_relay.py``) and the verdicts on a GPU rest on tested code.

The names torch's C++ side calls back differ between releases: 2.11 calls ``_allgather_base``,
``allgather_into_tensor_coalesced``, ``_reduce_scatter_base``, ``reduce_scatter_tensor_coalesced``
and ``alltoall_base``; 2.13 calls ``all_gather_single`` (or its coalesced form),
``reduce_scatter_single`` (and coalesced) and ``all_to_all_single``. Every name is answered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

#: the backend's name, as ``init_process_group`` takes it
BACKEND = "muongate_relay"


class _Done(dist.Work):
    """A collective that has completed by the time it is returned (every relayed one has)."""

    def __init__(self, result: Any) -> None:
        super().__init__()
        self._future: torch.futures.Future[Any] = torch.futures.Future()
        self._future.set_result(result)

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future[Any]:
        return self._future


def _host(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``t``, also where ``t`` is on the CPU (so the CPU runs the relay's path)."""
    return t.detach().to("cpu", copy=True)


def _given(opts: Any) -> tuple[Any, ...]:
    """A callback's options as gloo's binding takes them: torch 2.11's coalescing manager hands a
    Python group ``None`` (Megatron-core's distributed optimizer met it), which the binding refuses
    where its default would do."""
    return () if opts is None else (opts,)


def _hosts(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [_host(t) for t in tensors]


class Relay(dist.ProcessGroup):
    """A process group of ``size`` ranks whose collectives run on gloo over CPU copies."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta, name: str) -> None:
        super().__init__(rank, size)
        from torch._C._distributed_c10d import ProcessGroupGloo

        self._gloo: Any = ProcessGroupGloo(store, rank, size, timeout)
        if dist.get_debug_level() == dist.DebugLevel.DETAIL:
            # torch wraps the groups it makes so that ranks which disagree about a collective
            # are named (``TORCH_DISTRIBUTED_DEBUG=DETAIL``) but leaves a Python group alone:
            # its gloo group is wrapped instead, and checks the copies' shapes and ops.
            from torch.distributed.distributed_c10d import _create_process_group_wrapper

            self._gloo = _create_process_group_wrapper(self._gloo, f"{name}-detail", store, rank, size, timeout)
        self._name = name

    # A group written in Python has no backend of torch's to hold its name: it answers itself.
    def getBackendName(self) -> str:
        return BACKEND

    def getGroupName(self) -> str:
        return self._name

    def getGroupDesc(self) -> str:
        return self._name

    @property
    def group_name(self) -> str:
        return self._name

    @property
    def group_desc(self) -> str:
        return self._name

    def _relay(self, outputs: list[Any], call: Callable[[list[Any]], Any]) -> dist.Work:
        """``call`` on CPU copies of ``outputs`` (tensors or lists of tensors, copied in that
        shape), waited for; then every copy is written back into its tensor, and on a GPU
        the device is synchronized, so that the collective has completed, on every stream,
        when it returns."""
        flat = [t for o in outputs for t in (o if isinstance(o, list) else [o])]
        hosts = iter(_hosts(flat))
        copies = [[next(hosts) for _ in o] if isinstance(o, list) else next(hosts) for o in outputs]
        call(copies).wait()
        done = [h for c in copies for h in (c if isinstance(c, list) else [c])]
        for t, h in zip(flat, done, strict=True):
            t.copy_(h)
        devices = {t.device for t in flat if t.device.type == "cuda"}
        for device in devices:
            torch.cuda.synchronize(device)
        return _Done(outputs)

    # -- whole lists of tensors -----------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        return self._relay(tensors, lambda h: self._gloo.allreduce(h, *_given(opts)))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        return self._relay(tensors, lambda h: self._gloo.allreduce_coalesced(h, *_given(opts)))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        return self._relay(tensors, lambda h: self._gloo.broadcast(h, *_given(opts)))

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        return self._relay(tensors, lambda h: self._gloo.reduce(h, *_given(opts)))

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        return self._relay(outputs, lambda h: self._gloo.allgather(h, _hosts(inputs), *_given(opts)))

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        return self._relay(outputs, lambda h: self._gloo.gather(h, _hosts(inputs), *_given(opts)))

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None) -> dist.Work:
        return self._relay(outputs, lambda h: self._gloo.scatter(h, [_hosts(i) for i in inputs], *_given(opts)))

    def reduce_scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None
    ) -> dist.Work:
        return self._relay(outputs, lambda h: self._gloo.reduce_scatter(h, [_hosts(i) for i in inputs], *_given(opts)))

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        return self._relay(outputs, lambda h: self._gloo.alltoall(h, _hosts(inputs), *_given(opts)))

    def barrier(self, opts: Any = None) -> dist.Work:
        self._gloo.barrier(*_given(opts)).wait()
        return _Done([])

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> dist.Work:
        self._gloo.send(_hosts(tensors), dst, tag).wait()
        return _Done(tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> dist.Work:
        return self._relay(tensors, lambda h: self._gloo.recv(h, src, tag))

    # -- one tensor in, one out (each release's names) ---------------------------------
    def _gather_one(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        return self._relay([output], lambda h: self._gloo._allgather_base(h[0], _host(input), *_given(opts)))

    def _scatter_one(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        return self._relay([output], lambda h: self._gloo._reduce_scatter_base(h[0], _host(input), *_given(opts)))

    def _to_all(
        self, output: torch.Tensor, input: torch.Tensor, out_splits: list[int], in_splits: list[int], opts: Any = None
    ) -> dist.Work:
        return self._relay(
            [output], lambda h: self._gloo.alltoall_base(h[0], _host(input), out_splits, in_splits, *_given(opts))
        )

    def _gather_each(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        for o, i in zip(outputs, inputs, strict=True):
            self._gather_one(o, i, opts)
        return _Done(outputs)

    def _scatter_each(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        for o, i in zip(outputs, inputs, strict=True):
            self._scatter_one(o, i, opts)
        return _Done(outputs)

    _allgather_base = all_gather_single = _gather_one
    allgather_into_tensor_coalesced = all_gather_single_coalesced = _gather_each
    _reduce_scatter_base = reduce_scatter_single = _scatter_one
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced = _scatter_each
    alltoall_base = all_to_all_single = _to_all


def _create(options: Any, _: Any) -> Relay:
    """The group ``new_group`` asks for (torch's extended creator API, which names the group)."""
    return Relay(options.store, options.group_rank, options.group_size, options.timeout, options.group_id)


def missing() -> str | None:
    """What this torch lacks for the relay, in one line naming it; ``None`` where nothing is
    (it ran on torch 2.11 and 2.13)."""
    if not dist.is_available() or not dist.is_gloo_available():
        return f"torch {torch.__version__} was built without gloo, which the relay runs its collectives on"
    if not hasattr(dist.Backend, "register_backend"):
        return f"torch {torch.__version__} has no torch.distributed.Backend.register_backend"
    try:
        from torch._C._distributed_c10d import ProcessGroupGloo, _DistributedBackendOptions  # noqa: F401
    except ImportError as e:
        return f"torch {torch.__version__} lacks {e.name or str(e)} in torch._C._distributed_c10d"
    return None


def register() -> str:
    """Make ``BACKEND`` known to ``torch.distributed`` in this process (once); its name."""
    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])
    return BACKEND


def arrangement(backend: str, devices: list[str] | tuple[str, ...]) -> str:
    """How the ranks share their devices, for the header and the terminal; ``""`` where each
    rank has its own device and the backend's own collectives (gloo on CPU, NCCL a GPU a rank)."""
    if backend != BACKEND:
        return ""
    if devices[0].startswith("cuda"):
        gpus = sorted(set(devices))
        return (
            f"{len(devices)} ranks on {len(gpus)} GPU{'s' if len(gpus) > 1 else ''} ({', '.join(gpus)}); "
            "collectives relayed over gloo on the CPU, not NCCL"
        )
    return f"{len(devices)} ranks on the CPU; collectives relayed through CPU copies over gloo (--gate-comm relay)"
