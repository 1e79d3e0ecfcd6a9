"""Zero-bubble pipelining loses weight gradients of FSDP2 units nested in a stage (torch 2.13, gloo).

Run: ``torchrun --standalone --nproc-per-node 2 examples/findings/pipelining_zero_bubble_fsdp2_blocks.py``
(only torch; exits 1 while the finding holds, 0 once it is gone).

Four residual blocks in four pipeline stages, two a rank (torch's looped placement), three
micro-batches. Each stage is laid out as torchtitan and muongate's training gates lay a model
out: ``fully_shard`` on each block, then on the stage (here over one data-parallel rank, so
no reduction changes a value). After one schedule step each stage's gradients are compared
with one device's (the micro-batches' gradients summed, divided by their number):

- ``ScheduleInterleaved1F1B``, nested units: every gradient agrees;
- ``ScheduleInterleavedZeroBubble``, the stage alone under ``fully_shard``: every gradient agrees;
- ``ScheduleInterleavedZeroBubble``, nested units: gradients differ or are missing.

Zero-bubble schedules split a backward into the input pass and a later weight pass; torch's
pipelining runs FSDP2's post-backward by hand after the weight pass (pytorch/pytorch#134052),
and a likely cause, not traced in torch's code, is that a nested unit's own post-backward has
already run with the input pass. A torch bug of composability, by this reproducer; muongate's pipeline gates leave the schedule out
(``harness.tasks.pipeline.SCHEDULES``) and ``tests/test_step.py`` runs this file, so that the
day torch fixes it shows.
"""

import copy
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble

STAGES, MICRO, DIM = 4, 3, 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(DIM, 2 * DIM), nn.Linear(2 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


class Stage(nn.Module):
    def __init__(self, block: Block) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((out - target) ** 2).mean()


def differing(schedule_cls: type, nested: bool) -> list[str]:
    """The parameters of this rank's stages whose gradients differ from one device's."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    blocks = [Block() for _ in range(STAGES)]
    whole = copy.deepcopy(nn.Sequential(*blocks))
    x, y = torch.randn(2 * MICRO, 4, DIM), torch.randn(2 * MICRO, 4, DIM)
    for xc, yc in zip(x.tensor_split(MICRO), y.tensor_split(MICRO), strict=True):
        loss_fn(whole(xc), yc).backward()
    mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("pp", "dp"))
    indices = [c * world + rank for c in range(STAGES // world)]
    stages = []
    for i in indices:
        stage = Stage(blocks[i])
        if nested:
            fully_shard(stage.block, mesh=mesh["dp"])
        fully_shard(stage, mesh=mesh["dp"])
        stages.append(PipelineStage(stage, i, STAGES, torch.device("cpu"), group=mesh.get_group("pp")))
    schedule = schedule_cls(stages, MICRO, loss_fn=loss_fn)
    if rank == 0:
        schedule.step(x)
    elif rank == (STAGES - 1) % world:
        schedule.step(target=y, losses=[])
    else:
        schedule.step()
    expected = dict(whole.named_parameters())
    out = []
    for i, stage in zip(indices, stages, strict=True):
        for name, p in stage.submod.named_parameters():
            grad = None if p.grad is None else p.grad.full_tensor()
            want = expected[f"{i}.{name.removeprefix('block.')}"].grad / MICRO
            if grad is None or not torch.allclose(grad, want, rtol=1e-5, atol=1e-7):
                out.append(
                    f"stage {i} {name}: "
                    + ("no gradient" if grad is None else f"max|diff| {(grad - want).abs().max():.3g}")
                )
    return out


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    found = {}
    for schedule_cls, nested in (
        (ScheduleInterleaved1F1B, True),
        (ScheduleInterleavedZeroBubble, False),
        (ScheduleInterleavedZeroBubble, True),
    ):
        wrong = differing(schedule_cls, nested)
        label = f"{schedule_cls.__name__}, {'fully_shard on each block and the stage' if nested else 'fully_shard on the stage'}"
        found[label] = bool(wrong)
        print(
            f"rank {rank}: {label}: " + ("; ".join(wrong) if wrong else "every gradient agrees with one device"),
            flush=True,
        )
    dist.destroy_process_group()
    holds = found == {k: k.startswith("ScheduleInterleavedZeroBubble, fully_shard on each") for k in found}
    return 1 if holds else 0


if __name__ == "__main__":
    sys.exit(main())
