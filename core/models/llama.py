"""The llama family: llama, qwen2 and qwen3, one forward pass over one packed batch of tokens.

The forward pass is llama2.c's, over every token of a step at once (prefill chunks and decode tokens
together): each linear layer is one GEMM over all of them; RMSNorm and the SiLU gate are numba kernels
(core/kernels.py), RoPE with the KV-cache write and paged attention too (core/layers/attention.py,
through common.attention).

What sets the three apart is a flag each: llama rotates adjacent pairs (x[2i], x[2i + 1]); qwen2 and qwen3
rotate NEOX halves (x[i] with x[i + head_dim/2]) and add one thing to the fused q/k/v rows before RoPE:
qwen2 biases on Q, K and V, qwen3 a per-head RMSNorm of q and k (its head_dim is attention.key_length,
which need not be dim / n_heads: ModelConfig.from_gguf reads it).

A llama file may also carry what llama.cpp's llama graph reads when present: biases on Q, K, V and the
attention output and on the feed-forward's gate, up and down; and Llama 3's RoPE frequency factors
(rope_freqs.weight). RoPE scaling (linear, YaRN) and partial rotary come from the config (layers/rotary.py).

Every matrix is a `Linear` (core/layers/linear.py) in one weight format: "f32" dequantizes it once into a
float32 copy; "native" keeps the file's blocks where they are (a view of the memory map) and multiplies by
them directly, llama.cpp's way. Q/K/V are fused into one layer and gate/up into another, so each
transformer block runs four. The token embedding is an `Embedding` in the same format, and a missing
output.weight means the head is tied to it (common.Loader.lm_head).
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
from ..step_input import StepInput
from ..weights import TensorSpec, bias_name, bias_spec, check_tensors, tensor_name
from .common import (T, Loader, LoadedModel, attention, attention_specs, embedding_and_head_specs, feed_forward,
                     ffn_specs, logits, norm_specs, qk_norm, qk_norm_specs)


@dataclass
class LlamaLayer:
    attn_norm: np.ndarray  # (dim,)
    wqkv: Linear  # dim -> q_dim + 2 * kv_dim
    qkv_bias: np.ndarray | None  # (q_dim + 2 * kv_dim,): qwen2, or a llama file with q/k/v biases
    q_norm: np.ndarray | None  # (head_dim,): qwen3
    k_norm: np.ndarray | None  # (head_dim,): qwen3
    wo: Linear  # q_dim -> dim
    wo_bias: np.ndarray | None  # (dim,): a llama file with attn_output.bias
    ffn_norm: np.ndarray  # (dim,)
    w_gate_up: Linear  # dim -> 2 * ffn_dim: gate outputs first, then up
    gate_up_bias: np.ndarray | None  # (2 * ffn_dim,): a llama file with ffn_gate/ffn_up biases
    w_down: Linear  # ffn_dim -> dim
    down_bias: np.ndarray | None  # (dim,): a llama file with ffn_down.bias


def llama_tensor_specs(config: ModelConfig, has_qkv_bias: bool = False, has_qk_norm: bool = False,
                       optional_extras: bool = False) -> dict[str, TensorSpec]:
    """Every tensor a file of the family must hold (or may, if optional), with the shape its config implies.
    optional_extras: the llama graph's optional biases and RoPE frequency factors."""
    specs = embedding_and_head_specs(config)
    if optional_extras:
        specs[tensor_name(T.ROPE_FREQS)] = bias_spec((config.rope_dim or config.head_dim) // 2)
    for i in range(config.n_layers):
        specs |= norm_specs(config, i, T.ATTN_NORM, T.FFN_NORM) | attention_specs(config, i)
        if has_qk_norm:
            specs |= qk_norm_specs(config, i)
        specs |= ffn_specs(config, i)
        if has_qkv_bias or optional_extras:
            specs |= {bias_name(T.ATTN_Q, i): bias_spec(config.q_dim, optional_extras),
                      bias_name(T.ATTN_K, i): bias_spec(config.kv_dim, optional_extras),
                      bias_name(T.ATTN_V, i): bias_spec(config.kv_dim, optional_extras)}
        if optional_extras:
            specs |= {bias_name(T.ATTN_OUT, i): bias_spec(config.dim), bias_name(T.FFN_GATE, i): bias_spec(config.ffn_dim),
                      bias_name(T.FFN_UP, i): bias_spec(config.ffn_dim), bias_name(T.FFN_DOWN, i): bias_spec(config.dim)}
    return specs


def load_biases(loader: Loader, i: int, *kinds) -> np.ndarray | None:
    """Block i's biases of `kinds` side by side, as a fused layer's rows lay them out (zeros for a kind the file
    leaves out); None when it has none of them."""
    names = [bias_name(kind, i) for kind in kinds]
    if not any(name in loader.gguf.tensors for name in names):
        return None
    def part(name, kind):
        if name in loader.gguf.tensors:
            return loader.vector(name)
        return np.zeros(loader.gguf.tensors[tensor_name(kind, i)].shape[0], np.float32)  # as many as the rows
    return np.concatenate([part(name, kind) for name, kind in zip(names, kinds)])


class LlamaModel(LoadedModel):
    """One forward pass for the family; a subclass per architecture sets which additions its blocks have."""

    has_qkv_bias = False  # biases on Q, K and V (qwen2)
    has_qk_norm = False  # a per-head RMSNorm of q and k (qwen3)
    rope_neox = False  # RoPE on halves (qwen2, qwen3) rather than adjacent pairs
    optional_extras = True  # llama: optional biases and rope_freqs.weight, as llama.cpp's llama graph reads them

    @classmethod
    def tensor_specs(cls, gguf: GGUFFile, config: ModelConfig) -> dict[str, TensorSpec]:
        return llama_tensor_specs(config, cls.has_qkv_bias, cls.has_qk_norm, cls.optional_extras)

    def __init__(self, config: ModelConfig, loader: Loader):
        check_tensors(loader.gguf, self.tensor_specs(loader.gguf, config), config.architecture)
        self.layers = [
            LlamaLayer(
                attn_norm=loader.norm(T.ATTN_NORM, i),
                wqkv=loader.linear(T.ATTN_Q, T.ATTN_K, T.ATTN_V, block=i),
                qkv_bias=load_biases(loader, i, T.ATTN_Q, T.ATTN_K, T.ATTN_V),
                q_norm=loader.norm(T.ATTN_Q_NORM, i) if self.has_qk_norm else None,
                k_norm=loader.norm(T.ATTN_K_NORM, i) if self.has_qk_norm else None,
                wo=loader.linear(T.ATTN_OUT, block=i),
                wo_bias=load_biases(loader, i, T.ATTN_OUT),
                ffn_norm=loader.norm(T.FFN_NORM, i),
                w_gate_up=loader.linear(T.FFN_GATE, T.FFN_UP, block=i),
                gate_up_bias=load_biases(loader, i, T.FFN_GATE, T.FFN_UP),
                w_down=loader.linear(T.FFN_DOWN, block=i),
                down_bias=load_biases(loader, i, T.FFN_DOWN),
            )
            for i in range(config.n_layers)
        ]
        self._load_embedding_and_head(config, loader)
        freqs = tensor_name(T.ROPE_FREQS)
        self.rope = RopeTable(config.rope(), loader.vector(freqs) if freqs in loader.gguf.tensors else None)

    @classmethod
    def read_config(cls, gguf: GGUFFile) -> ModelConfig:
        return dataclasses.replace(ModelConfig.from_gguf(gguf), rope_neox=cls.rope_neox)

    def forward(self, step: StepInput, cache: KVCache) -> np.ndarray:
        """Run one step: write the new tokens' K/V into `cache`; return logits (R, vocab) for step.logit_rows."""
        return logits(self._blocks(step, cache), step.logit_rows, self.output_norm, self.lm_head, self.config.rms_eps)

    def hidden_states(self, step: StepInput, cache: KVCache) -> np.ndarray:
        """The same step's final-normed hidden state of every token (T, dim), where an embedding pools them."""
        x = self._blocks(step, cache)
        kernels.rmsnorm(x, self.output_norm, self.config.rms_eps, x)
        return x

    def _blocks(self, step: StepInput, cache: KVCache) -> np.ndarray:
        """The transformer blocks over the step's tokens: the residual stream after the last one (T, dim)."""
        cfg = self.config
        n_tokens = len(step.token_ids)
        rope = self.rope.upto(step.positions)
        x = self.token_embd(step.token_ids)
        normed = np.empty_like(x)
        attn_out = np.empty((n_tokens, cfg.n_heads, cfg.head_dim), dtype=np.float32)
        for i, layer in enumerate(self.layers):
            kernels.rmsnorm(x, layer.attn_norm, cfg.rms_eps, normed)
            qkv = layer.wqkv(normed)
            if layer.qkv_bias is not None:
                qkv += layer.qkv_bias
            if self.has_qk_norm:
                qk_norm(qkv, layer.q_norm, layer.k_norm, cfg)
            x += layer.wo(attention(qkv, i, step, cache, cfg, rope, self.scale, attn_out), layer.wo_bias)
            kernels.rmsnorm(x, layer.ffn_norm, cfg.rms_eps, normed)
            x += feed_forward(normed, layer.w_gate_up, layer.w_down, kernels.silu_mul, layer.gate_up_bias,
                              layer.down_bias)
        return x


class Qwen2Model(LlamaModel):
    has_qkv_bias, rope_neox, optional_extras = True, True, False


class Qwen3Model(LlamaModel):
    has_qk_norm, rope_neox, optional_extras = True, True, False
