"""A tiny, randomly initialised Llama from Hugging Face ``transformers`` for ``--model``:
built from a config, nothing downloaded. Written for transformers 5.24 (``pip install
-e .[models]``).

    pytest -m gate --nproc 4 --model examples.hf_llama:llama -k model

Byte-level (vocabulary 256), 2 layers, width 32, 2 attention heads; eager attention (plain
matmuls and softmax). Its tensor-parallel plan is the library's own
(``LlamaConfig.base_model_tp_plan``: Q, K, V and the MLP's gate and up projections
column-wise, the attention output and the down projection row-wise), under the causal-LM
wrapper's ``model.`` prefix.
"""

from __future__ import annotations

from transformers import LlamaConfig, LlamaForCausalLM

CONFIG = LlamaConfig(
    vocab_size=256,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=64,
    attn_implementation="eager",
)


def llama() -> LlamaForCausalLM:
    return LlamaForCausalLM(CONFIG)


llama.muongate_blocks = "model.layers"  # type: ignore[attr-defined]
llama.muongate_tp_plan = {f"model.{path}": style for path, style in CONFIG.base_model_tp_plan.items()}  # type: ignore[attr-defined]
