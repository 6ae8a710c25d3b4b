"""A tiny random Llama for the engine tests: small enough to check against HF's forward and the
slow definition token by token."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 97


def tiny_llama(kv_heads: int, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=512,
        attn_implementation="eager",
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # random init is near-uniform; sharpen it so the test has teeth
        for p in model.parameters():
            p.mul_(4.0)
    return model
