"""A small decoder-only transformer trained on text that ships with Python.

Data: Python's own documentation text (``harness.models.corpus``), one token per byte
(vocabulary 256), so a loss in nats per token divided by ln 2 is bits per byte.

Model: token embedding, ``layers`` pre-norm blocks (causal self-attention written out
with matmuls, so it is deterministic on every device, then an MLP), a final norm and an
untied head. Q, K and V are separate ``[d, d]`` matrices, or one fused ``[3d, d]`` matrix
with ``fused_qkv``: Muon orthogonalizes a fused QKV as one matrix, which is a different
optimizer step, and the report says which ran. The MLP is dense, or the MoE layer of
``harness.moe`` with its fix (every expert runs, on an empty batch where it has no
tokens), routed by its own learned top-1 router, so experts do go empty on a rank.

FSDP2 wraps each block and then the whole model. Muon takes the hidden matrices; AdamW
takes the embedding, the head and the norms.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.distributed.fsdp import fully_shard

from harness.algorithms import MUON
from harness.cases.case import candidate_name
from harness.models.corpus import held_out_bits, next_byte_loss
from harness.models.moe import MoE
from harness.models.step import FULL, ONE, THROUGH, Accumulation, Precision, Resume

Mlp = Literal["dense", "moe"]


@dataclass(frozen=True)
class TransformerCase:
    """What to train and how: model shape, MLP kind, QKV layout, ranks, steps, settings."""

    name: str
    mlp: Mlp = "dense"
    fused_qkv: bool = False
    world_size: int = 2
    steps: int = 4
    seed: int = 0
    dim: int = 32
    heads: int = 2
    layers: int = 2
    seq: int = 32
    batch: int = 4
    experts: int = 4
    candidate: Any = None
    settings: tuple[tuple[str, Any], ...] = field(
        default=(("lr", 0.02), ("weight_decay", 0.01), ("adamw_lr", 3e-3), ("adamw_weight_decay", 0.01))
    )
    adamw_modules: tuple[str, ...] = ("embed", "head")
    #: the reference class it trains against (``harness.algorithms``): Muon, whose settings the
    #: defaults above are, unless a candidate of another family replaces both
    reference: Any = MUON.factory
    #: what the step computes and reduces in (FSDP2's mixed-precision policy, autocast)
    precision: Precision = FULL
    #: the micro-batches of a step and when FSDP2 reduces them
    accumulation: Accumulation = ONE
    #: HSDP's replicas: FSDP2 on a ``(replicate, shard)`` mesh; 1: on a 1-D mesh
    replicate: int = 1
    #: the learning-rate schedule, and after how many steps the sharded side resumes (0: never)
    resume: Resume = THROUGH

    def __post_init__(self) -> None:
        if self.replicate < 1 or self.world_size % self.replicate:
            raise ValueError(
                f"TransformerCase replicate={self.replicate}: HSDP's replicas must divide world_size={self.world_size}"
            )
        if self.resume.world and (self.resume.world >= self.world_size or self.replicate > 1):
            raise ValueError(
                f"TransformerCase resume world={self.resume.world} with world_size={self.world_size}, "
                f"replicate={self.replicate}: a resume continues on fewer ranks of a 1-D mesh"
            )
        if self.resume.after >= self.steps:
            raise ValueError(
                f"TransformerCase resume after={self.resume.after} with steps={self.steps}: it resumes before its last step"
            )
        if self.accumulation.sync == "last_all_reduce" and self.replicate == 1:
            raise ValueError(
                "TransformerCase accumulation sync='last_all_reduce' with replicate=1: FSDP2 all-reduces "
                "across replicas only under HSDP"
            )

    def describe(self) -> str:
        qkv = "fused QKV [3d, d]" if self.fused_qkv else "separate Q, K, V [d, d]"
        hsdp = f", HSDP {self.replicate} x {self.world_size // self.replicate}" if self.replicate > 1 else ""
        return (
            f"TransformerCase({self.name}: {self.layers} layers, d={self.dim}, {self.heads} heads, {self.mlp} MLP, "
            f"{qkv}, world={self.world_size}, steps={self.steps}, batch {self.batch}x{self.seq} bytes per rank, "
            f"seed={self.seed}, candidate={candidate_name(self.candidate, self.reference)}{self.precision.clause()}"
            f"{self.accumulation.clause()}{hsdp}{self.resume.clause()})"
        )

    def restored(self, opt: torch.optim.Optimizer, schedule: Any, state: dict[str, Any]) -> None:
        """After a resume's load into the fresh ``opt``: ``schedule`` takes its saved ``state``
        (what a planted resume gets wrong, ``gates.step_controls``)."""
        schedule.load_state_dict(state)

    # -- harness.tasks.training.TrainingSpec --
    def build(self) -> Transformer:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return Transformer(self)

    def tp_plan(self) -> dict[str, Any]:
        """Megatron-style tensor parallelism for ``parallelize_module``: Q, K, V and the MLP's
        first matrix column-wise (each rank a share of the heads and hidden units), the
        attention output and the MLP's second matrix row-wise; the rest replicated."""
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        if self.mlp != "dense" or self.fused_qkv:
            raise ValueError(f"{self.name}: tensor parallelism is planned for the dense MLP with separate Q, K, V only")
        plan: dict[str, Any] = {}
        for i in range(self.layers):
            for name in ("attn.q", "attn.k", "attn.v", "mlp.0"):
                plan[f"blocks.{i}.{name}"] = ColwiseParallel()
            for name in ("attn.proj", "mlp.2"):
                plan[f"blocks.{i}.{name}"] = RowwiseParallel()
        return plan

    def shard(self, model: nn.Module, mesh: Any) -> None:
        self.wrap(model, mesh, self.precision.policy())

    @staticmethod
    def wrap(model: nn.Module, mesh: Any, policy: Any) -> None:
        """``fully_shard`` each block, then the whole model (or a pipeline ``Stage`` of it), on
        ``mesh`` (HSDP on a 2-D one) with ``policy``."""
        assert isinstance(model, (Transformer, Stage))
        for block in [m for m in model.modules() if isinstance(m, Block)]:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)

    def loss(self, model: nn.Module, rank: int, step: int, device: torch.device) -> Tensor:
        """Cross-entropy (nats per byte) on ``rank``'s micro-batch of ``step`` (``next_byte_loss``)."""
        return next_byte_loss(model, self.seed, rank, step, self.batch, self.seq, device)

    def evaluate(self, model: nn.Module, device: torch.device) -> float:
        """Bits per byte on the first 16 windows of the held-out bytes."""
        return held_out_bits(model, self.seq, device)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, fused_qkv: bool) -> None:
        super().__init__()
        self.head_dim = dim // heads
        if fused_qkv:
            self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        else:
            self.q = nn.Linear(dim, dim, bias=False)
            self.k = nn.Linear(dim, dim, bias=False)
            self.v = nn.Linear(dim, dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1) if hasattr(self, "qkv") else (self.q(x), self.k(x), self.v(x))
        # under tensor parallelism q, k and v hold this rank's heads only, hence -1
        q, k, v = (z.view(b, t, -1, self.head_dim).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * self.head_dim**-0.5
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        y = scores.masked_fill(causal, float("-inf")).softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, case: TransformerCase) -> None:
        super().__init__()
        d = case.dim
        self.norm1 = nn.RMSNorm(d)
        self.attn = Attention(d, case.heads, case.fused_qkv)
        self.norm2 = nn.RMSNorm(d)
        self.mlp: nn.Module
        if case.mlp == "moe":
            self.mlp = MoE(d, 2 * d, case.experts, residual=False)
        else:
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d, bias=False), nn.GELU(), nn.Linear(4 * d, d, bias=False))

    def forward(self, h: Tensor) -> Tensor:
        h = h + self.attn(self.norm1(h))
        if isinstance(self.mlp, MoE):
            return h + self.mlp(self.norm2(h).flatten(0, 1)).view_as(h)
        return h + self.mlp(self.norm2(h))


class Transformer(nn.Module):
    def __init__(self, case: TransformerCase) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, case.dim)
        self.blocks = nn.ModuleList(Block(case) for _ in range(case.layers))
        self.norm = nn.RMSNorm(case.dim)
        self.head = nn.Linear(case.dim, 256, bias=False)

    def forward(self, tokens: Tensor) -> Tensor:
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


class Stage(nn.Module):
    """Stage ``index`` of ``stages`` of a ``Transformer`` for pipeline parallelism, as users
    split one by hand (``torch.distributed.pipelining.PipelineStage`` over a module of their
    own): the first stage holds the embedding, each its share of the blocks, the last the final
    norm and the head. It holds the model's own modules under their names in the model, so a
    parameter is named as in the whole model (``blocks.3.attn.q.weight``)."""

    def __init__(self, model: Transformer, index: int, stages: int) -> None:
        super().__init__()
        layers = len(model.blocks)
        if not 0 <= index < stages or layers % stages:
            raise ValueError(f"stage {index} of {stages}: the stages must divide the model's {layers} blocks")
        per = layers // stages
        if index == 0:
            self.embed = model.embed
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in range(index * per, (index + 1) * per)})
        if index == stages - 1:
            self.norm, self.head = model.norm, model.head

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x) if hasattr(self, "embed") else x
        for block in self.blocks.values():
            h = block(h)
        return self.head(self.norm(h)) if hasattr(self, "head") else h
