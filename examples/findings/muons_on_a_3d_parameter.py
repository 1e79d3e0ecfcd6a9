"""What Muons do with a 3-D parameter, such as a stack of experts' matrices (torch 2.13, one device).

Run: ``python examples/findings/muons_on_a_3d_parameter.py PACKAGE`` with PACKAGE one of
``torch``, ``pytorch_optimizer``, ``keller``, ``muon_fsdp2`` or ``emerging`` (only torch and that package;
exits 1 while the stack is not stepped as its matrices one by one, 0 once it is).

muongate's reference steps a batch-first ``[E, m, n]`` stack as ``E`` matrices of ``[m, n]``
(an expert's weight is a matrix). The matrix's probe of undeclared features tried a stack on
each Muon whose adapter does not declare ``experts``. What each package does, on one device,
from a zero state, one step at lr 0.02: a stack of two ``[4, 4]`` matrices against the same two
matrices stepped as parameters of their own.

* ``torch``: ``torch.optim.Muon`` refuses it by name (``ValueError: Muon only supports 2D
  parameters``): a limit it states.
* ``pytorch_optimizer``: ``Muon`` orthogonalizes the flattened ``[E, m·n]`` view, as its
  docstring says ("The orthogonal update uses a flattened matrix view"): a convention, one
  matrix for the whole stack.
* ``keller`` (``muon-optimizer``): batched Newton–Schulz over the leading dimension, the
  stack's matrices one by one (its adapter declares ``experts``).
* ``muon_fsdp2``: a batched Newton–Schulz too, compiled, on FSDP2 parameters (here a one-rank
  mesh in this process, gloo): the stack's matrices one by one, up to the bf16 rounding of the
  batched compiled kernel (4.06e-4 here, where the flattened view is 0.0114 away).
* ``emerging`` (NVIDIA ``emerging-optimizers`` 0.3.0, Python ≥ 3.12): its ``Muon`` refuses it
  by name (``ValueError: Only 2D parameters are supported.``), and says in its docstring that a
  subclass may reshape N-D parameters itself: a limit it states.
"""

import sys

import torch
import torch.distributed as dist


def optimizer(package: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if package == "torch":
        return torch.optim.Muon(params, lr=0.02)
    if package == "pytorch_optimizer":
        from pytorch_optimizer import Muon

        return Muon([{"params": params, "use_muon": True}], lr=0.02)
    if package == "keller":
        from muon import SingleDeviceMuon

        return SingleDeviceMuon(params, lr=0.02)
    if package == "muon_fsdp2":
        from muon_fsdp2 import Muon as FsdpMuon

        return FsdpMuon([{"params": params, "use_muon": True, "lr": 0.02}])
    if package == "emerging":
        from emerging_optimizers.orthogonalized_optimizers.muon import Muon as EmergingMuon

        return EmergingMuon(params, lr=0.02)
    raise SystemExit(f"PACKAGE must be torch, pytorch_optimizer, keller, muon_fsdp2 or emerging, not {package!r}")


def sharded(package: str, params: list[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    """muon-fsdp2 takes FSDP2's DTensors only: each parameter (and its gradient) on a one-rank mesh."""
    if package != "muon_fsdp2":
        return params
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    if not dist.is_initialized():  # one process: an in-memory store, no port
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    out = []
    for p in params:
        d = torch.nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)]))
        assert p.grad is not None
        d.grad = distribute_tensor(p.grad, mesh, [Shard(0)])
        out.append(d)
    return out


def whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def main(package: str) -> int:
    torch.manual_seed(0)
    grad = torch.randn(2, 4, 4)
    stack = torch.nn.Parameter(torch.randn(2, 4, 4))
    one_by_one = [torch.nn.Parameter(stack.detach()[i].clone()) for i in range(2)]
    stack.grad = grad.clone()
    for p, g in zip(one_by_one, grad, strict=True):
        p.grad = g.clone()
    (stack,), one_by_one = sharded(package, [stack]), sharded(package, one_by_one)
    try:
        optimizer(package, [stack]).step()
    except Exception as e:
        print(f"{package}: a [2, 4, 4] stack refused: {type(e).__name__}: {e}")
        return 1
    optimizer(package, one_by_one).step()
    off = (whole(stack.detach()) - torch.stack([whole(p.detach()) for p in one_by_one])).abs().max().item()
    print(f"{package}: a [2, 4, 4] stack against its matrices stepped one by one: max|diff| {off:.3g}")
    return 1 if off else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "torch"))
