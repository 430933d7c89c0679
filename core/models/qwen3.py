"""Qwen3: llama's block with a per-head RMSNorm of q and k before NEOX RoPE, no biases.

head_dim is attention.key_length, which need not be dim / n_heads (ModelConfig.from_gguf reads it).
Matrices are `Linear` layers in one weight format, as in llama.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .. import kernels
from ..config import ModelConfig
from ..gguf_file import GGUFFile
from ..kv_cache import KVCache
from ..layers.linear import Linear
from ..layers.rotary import RopeTable
from ..model_runner import StepInput
from ..weights import TensorSpec, check_tensors, norm, tensor_name
from .common import (T, Loader, LoadedModel, attention, attention_specs, embedding_and_head_specs, ffn_specs, logits,
                     qk_norm, qk_norm_specs)


@dataclass
class Qwen3Layer:
    attn_norm: np.ndarray  # (dim,)
    wqkv: Linear  # dim -> q_dim + 2 * kv_dim
    q_norm: np.ndarray  # (head_dim,)
    k_norm: np.ndarray  # (head_dim,)
    wo: Linear  # q_dim -> dim
    ffn_norm: np.ndarray  # (dim,)
    w_gate_up: Linear  # dim -> 2 * ffn_dim: gate outputs first, then up
    w_down: Linear  # ffn_dim -> dim


def qwen3_tensor_specs(config: ModelConfig) -> dict[str, TensorSpec]:
    specs = embedding_and_head_specs(config)
    for i in range(config.n_layers):
        specs |= {tensor_name(T.ATTN_NORM, i): norm(config.dim), tensor_name(T.FFN_NORM, i): norm(config.dim)}
        specs |= attention_specs(config, i) | qk_norm_specs(config, i) | ffn_specs(config, i)
    return specs


class Qwen3Model(LoadedModel):
    def __init__(self, config: ModelConfig, loader: Loader):
        check_tensors(loader.gguf, qwen3_tensor_specs(config))
        self.layers = [
            Qwen3Layer(
                attn_norm=loader.norm(T.ATTN_NORM, i),
                wqkv=loader.linear(T.ATTN_Q, T.ATTN_K, T.ATTN_V, block=i),
                q_norm=loader.norm(T.ATTN_Q_NORM, i),
                k_norm=loader.norm(T.ATTN_K_NORM, i),
                wo=loader.linear(T.ATTN_OUT, block=i),
                ffn_norm=loader.norm(T.FFN_NORM, i),
                w_gate_up=loader.linear(T.FFN_GATE, T.FFN_UP, block=i),
                w_down=loader.linear(T.FFN_DOWN, block=i),
            )
            for i in range(config.n_layers)
        ]
        self._load_embedding_and_head(config, loader)
        self.rope = RopeTable(config.head_dim, config.rope_theta)

    @staticmethod
    def read_config(gguf: GGUFFile) -> ModelConfig:
        return dataclasses.replace(ModelConfig.from_gguf(gguf), rope_neox=True)

    def forward(self, step: StepInput, cache: KVCache, batch_invariant: bool = False) -> np.ndarray:
        """Run one step: write the new tokens' K/V into `cache`; return logits (R, vocab) for step.logit_rows."""
        cfg, inv = self.config, batch_invariant
        n_tokens = len(step.token_ids)
        rope = self.rope.upto(step.positions)
        x = self.token_embd(step.token_ids)
        normed = np.empty_like(x)
        attn_out = np.empty((n_tokens, cfg.n_heads, cfg.head_dim), dtype=np.float32)
        act = np.empty((n_tokens, cfg.ffn_dim), dtype=np.float32)
        for i, layer in enumerate(self.layers):
            kernels.rmsnorm(x, layer.attn_norm, cfg.rms_eps, normed)
            qkv = layer.wqkv(normed, inv)
            qk_norm(qkv, layer.q_norm, layer.k_norm, cfg)
            x += layer.wo(attention(qkv, i, step, cache, cfg, rope, self.scale, attn_out), inv)
            kernels.rmsnorm(x, layer.ffn_norm, cfg.rms_eps, normed)
            kernels.silu_mul(layer.w_gate_up(normed, inv), act)
            x += layer.w_down(act, inv)
        return logits(x, step.logit_rows, self.output_norm, self.lm_head, cfg.rms_eps, inv)
