"""muon-fsdp2 0.3.0 fails on any FSDP2 mesh whose ranks are not 0..n-1 (torch 2.13, gloo).

Run: ``torchrun --standalone --nproc-per-node 2 examples/findings/muon_fsdp2_submesh_rank.py``
(only torch and ``muon-fsdp2==0.3.0``; exits 1 while the finding holds, 0 once it is gone).

``Fsdp1dWork`` picks each matrix's owner as a rank *of the mesh's group*
(``index % world_size``, passed as ``group_dst``), but asks "am I the owner?" with
``device_mesh.get_rank()``, the *global* rank. On a mesh that is a slice of a bigger world
(one data-parallel replica of HSDP or of a pipeline stage, here the 1-rank ``shard`` dim of a
``(2, 1)`` mesh), no rank of the slice ``[1]`` matches owner 0, so the owner calls ``gather``
without a ``gather_list``: ``ValueError: Argument ``gather_list`` must be specified on
destination rank``. Found by ``--against self``, which runs the candidate on a one-rank mesh
of each rank alone. A bug in the package.
"""

import sys

import torch
import torch.distributed as dist
from muon_fsdp2 import Muon
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("replicate", "shard"))["shard"]
    model = nn.Linear(4, 4, bias=False)
    fully_shard(model, mesh=mesh)
    model(torch.randn(2, 4)).square().sum().backward()
    try:
        Muon([{"params": list(model.parameters()), "use_muon": True}]).step()
    except ValueError as e:
        print(f"rank {rank} (mesh {mesh.mesh.tolist()}): step failed: ValueError: {e}", flush=True)
        return 1
    print(f"rank {rank} (mesh {mesh.mesh.tolist()}): step completed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
