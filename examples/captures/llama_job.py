"""The job that captured ``llama-fsdp16.json``: a small Llama (2 layers, width 512, 8 query
heads and 2 key/value heads, SwiGLU of 1376, a vocabulary of 32003) laid out with FSDP2
(``fully_shard`` per block, then the root) over every rank, muongate's ``ShardedMuon`` on the
block matrices and AdamW groups for the embedding, the norms and the output head; one step on
random tokens, then the capture (``harness.capture``)::

    torchrun --standalone --nproc-per-node 16 examples/captures/llama_job.py llama-fsdp16.json

Any world size runs; 16 ranks on a small machine need about 3 GB of memory and a minute.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from distributed_impl import ShardedMuon
from harness.capture import capture

WIDTH, HEADS, KV_HEADS, HIDDEN, VOCAB, LAYERS = 512, 8, 2, 1376, 32003, 2


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        head = WIDTH // HEADS
        self.attention_norm = nn.RMSNorm(WIDTH)
        self.wq = nn.Linear(WIDTH, HEADS * head, bias=False)
        self.wk = nn.Linear(WIDTH, KV_HEADS * head, bias=False)
        self.wv = nn.Linear(WIDTH, KV_HEADS * head, bias=False)
        self.wo = nn.Linear(HEADS * head, WIDTH, bias=False)
        self.ffn_norm = nn.RMSNorm(WIDTH)
        self.w1 = nn.Linear(WIDTH, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, WIDTH, bias=False)
        self.w3 = nn.Linear(WIDTH, HIDDEN, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        h = self.attention_norm(x)
        q = self.wq(h).view(b, t, HEADS, -1).transpose(1, 2)
        k = self.wk(h).view(b, t, KV_HEADS, -1).transpose(1, 2).repeat_interleave(HEADS // KV_HEADS, dim=1)
        v = self.wv(h).view(b, t, KV_HEADS, -1).transpose(1, 2).repeat_interleave(HEADS // KV_HEADS, dim=1)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        x = x + self.wo(attended)
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(WIDTH)
        self.output = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def main(path: str) -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = Llama()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp",))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    named = list(model.named_parameters())
    hidden = [(n, p) for n, p in named if n.startswith("layers.") and p.ndim == 2]
    rest = [(n, p) for n, p in named if not (n.startswith("layers.") and p.ndim == 2)]
    optimizer = ShardedMuon(
        [
            {"params": [p for _, p in hidden], "param_names": [n for n, _ in hidden], "use_muon": True},
            {"params": [p for _, p in rest], "param_names": [n for n, _ in rest], "use_muon": False},
        ],
        lr=0.02,
    )
    tokens = torch.randint(0, VOCAB, (2, 16))
    F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
    optimizer.step()
    capture(model, optimizer, path)
    dist.barrier()  # every rank out of its last collective before any tears gloo down
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    # Leave without the interpreter's teardown: gloo's threads outlive destroy_process_group after
    # DTensor and can abort the job there (findings/torch_gloo_threads_outlive_destroy.py).
    sys.stdout.flush()
    os._exit(0)
