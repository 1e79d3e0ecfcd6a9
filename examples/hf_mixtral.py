"""A tiny, randomly initialised Mixtral (mixture of experts) from Hugging Face
``transformers`` for ``--model``: built from a config, nothing downloaded. Written for
transformers 5.24 (``pip install -e .[models]``).

    pytest -m gate --nproc 2 --model examples.hf_mixtral:mixtral -k model

Byte-level (vocabulary 256), 2 layers, width 32, 4 experts, top-2 routing, eager attention
(with top-1 the router's gradient is rounding noise: the one weight is renormalized to 1).
The empty-expert scenario is built in: on rank 1 the router never sends a token to expert 0
(``muongate_on_rank`` sets a flag that a forward hook on every router reads, moving those
tokens to expert 1, or 2 where 1 is the token's other choice), which is the rank asymmetry that deadlocks FSDP2 when each expert is
its own unit. transformers 5 stores each layer's experts as one 3-D parameter per
projection (``experts.gate_up_proj`` ``[E, 2I, d]``, ``experts.down_proj`` ``[E, d, I]``),
so no expert can be an FSDP2 unit of its own: FSDP2 wraps each decoder layer.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import MixtralConfig, MixtralForCausalLM
from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter

CONFIG = MixtralConfig(
    vocab_size=256,
    hidden_size=32,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    num_local_experts=4,
    num_experts_per_tok=2,
    max_position_embeddings=64,
    attn_implementation="eager",
)
EMPTY_RANK, EMPTY_EXPERT = 1, 0


def _steer(router: nn.Module, args: Any, out: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> Any:
    logits, scores, indices = out
    if getattr(router, "muongate_starve", False):
        other = indices.flip(-1)  # the token's other choice (top-2)
        instead = torch.where(other == EMPTY_EXPERT + 1, EMPTY_EXPERT + 2, EMPTY_EXPERT + 1)
        indices = torch.where(indices == EMPTY_EXPERT, instead, indices)
    return logits, scores, indices


def mixtral() -> MixtralForCausalLM:
    model = MixtralForCausalLM(CONFIG)
    for m in model.modules():
        if isinstance(m, MixtralTopKRouter):
            m.register_forward_hook(_steer)
    return model


def _on_rank(model: nn.Module, rank: int) -> None:
    for m in model.modules():
        if isinstance(m, MixtralTopKRouter):
            m.muongate_starve = rank == EMPTY_RANK  # type: ignore[assignment]


mixtral.muongate_blocks = "model.layers"  # type: ignore[attr-defined]
mixtral.muongate_on_rank = _on_rank  # type: ignore[attr-defined]
mixtral.muongate_no_tokens = (f"rank {EMPTY_RANK} sends no tokens to expert {EMPTY_EXPERT}",)  # type: ignore[attr-defined]
mixtral.muongate_wrapping = "each decoder layer (experts stacked: one 3-D parameter per projection)"  # type: ignore[attr-defined]
