"""Llama: its tensors and its forward pass over one packed batch of tokens.

The forward pass is llama2.c's, over every token of a step at once (prefill chunks and decode tokens
together): each linear layer is one GEMM over all of them; RMSNorm and the SiLU gate are numba kernels
(core/kernels.py), RoPE with the KV-cache write and paged attention too (core/layers/attention.py,
through common.attention). RoPE rotates adjacent pairs (x[2i], x[2i + 1]).

Every matrix is a `Linear` (core/layers/linear.py) in one weight format: "f32" dequantizes it once into a
float32 copy; "native" keeps the file's blocks where they are (a view of the memory map) and multiplies by
them directly, llama.cpp's way. Q/K/V are fused into one layer and gate/up into another, so each
transformer block runs four. The token embedding is an `Embedding` in the same format, and a missing
output.weight means the head is tied to it (common.Loader.lm_head).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import kernels
from ..config import ModelConfig
from ..kv_cache import KVCache
from ..layers.linear import Linear
from ..layers.rotary import RopeTable
from ..step_input import StepInput
from ..weights import TensorSpec, check_tensors
from .common import (T, Loader, LoadedModel, attention, attention_specs, embedding_and_head_specs, feed_forward,
                     ffn_specs, logits, norm_specs)


@dataclass
class LlamaLayer:
    attn_norm: np.ndarray  # (dim,)
    wqkv: Linear  # dim -> q_dim + 2 * kv_dim
    wo: Linear  # q_dim -> dim
    ffn_norm: np.ndarray  # (dim,)
    w_gate_up: Linear  # dim -> 2 * ffn_dim: gate outputs first, then up
    w_down: Linear  # ffn_dim -> dim


def llama_tensor_specs(config: ModelConfig) -> dict[str, TensorSpec]:
    """Every tensor a llama file must hold (or may, if optional), with the shape its config implies."""
    specs = embedding_and_head_specs(config)
    for i in range(config.n_layers):
        specs |= norm_specs(config, i, T.ATTN_NORM, T.FFN_NORM) | attention_specs(config, i) | ffn_specs(config, i)
    return specs


class LlamaModel(LoadedModel):
    def __init__(self, config: ModelConfig, loader: Loader):
        check_tensors(loader.gguf, llama_tensor_specs(config))
        self.layers = [
            LlamaLayer(
                attn_norm=loader.norm(T.ATTN_NORM, i),
                wqkv=loader.linear(T.ATTN_Q, T.ATTN_K, T.ATTN_V, block=i),
                wo=loader.linear(T.ATTN_OUT, block=i),
                ffn_norm=loader.norm(T.FFN_NORM, i),
                w_gate_up=loader.linear(T.FFN_GATE, T.FFN_UP, block=i),
                w_down=loader.linear(T.FFN_DOWN, block=i),
            )
            for i in range(config.n_layers)
        ]
        self._load_embedding_and_head(config, loader)
        self.rope = RopeTable(config.head_dim, config.rope_theta)

    def forward(self, step: StepInput, cache: KVCache) -> np.ndarray:
        """Run one step: write the new tokens' K/V into `cache`; return logits (R, vocab) for step.logit_rows."""
        cfg = self.config
        n_tokens = len(step.token_ids)
        rope = self.rope.upto(step.positions)
        x = self.token_embd(step.token_ids)
        normed = np.empty_like(x)
        attn_out = np.empty((n_tokens, cfg.n_heads, cfg.head_dim), dtype=np.float32)
        for i, layer in enumerate(self.layers):
            kernels.rmsnorm(x, layer.attn_norm, cfg.rms_eps, normed)
            qkv = layer.wqkv(normed)
            x += layer.wo(attention(qkv, i, step, cache, cfg, rope, self.scale, attn_out))
            kernels.rmsnorm(x, layer.ffn_norm, cfg.rms_eps, normed)
            x += feed_forward(normed, layer.w_gate_up, layer.w_down, kernels.silu_mul)
        return logits(x, step.logit_rows, self.output_norm, self.lm_head, cfg.rms_eps)
