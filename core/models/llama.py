"""Llama: its tensors, how they load, and its forward pass over one packed batch of tokens.

The forward pass is llama2.c's, over every token of a step at once (prefill chunks and decode tokens
together): each linear layer is one float32 GEMM over all of them; RMSNorm, RoPE with the KV-cache write,
SiLU-gate and paged attention are numba kernels (core/kernels.py).

Weights are float32 arrays laid out for `x @ W`: GGUF stores a linear layer as (out, in) rows, we keep
(in, out) C-contiguous copies and fuse Q/K/V into one matrix and gate/up into another, so each layer runs
four GEMMs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import MODEL_TENSOR

from .. import kernels
from ..config import ModelConfig
from ..dequant import dequantize
from ..gguf_file import GGUFFile
from ..kv_cache import KVCache
from ..layers.gemm import gemm
from ..layers.rotary import empty_rope_tables, extend_rope_tables
from ..model_runner import StepInput
from ..weights import TensorSpec, check_tensors, linear_in_out, matrix, norm, tensor_name


@dataclass
class LayerWeights:
    attn_norm: np.ndarray  # (dim,)
    wqkv: np.ndarray  # (dim, q_dim + 2 * kv_dim)
    wo: np.ndarray  # (q_dim, dim)
    ffn_norm: np.ndarray  # (dim,)
    w_gate_up: np.ndarray  # (dim, 2 * ffn_dim): gate columns first, then up
    w_down: np.ndarray  # (ffn_dim, dim)


@dataclass
class LlamaWeights:
    token_embd: np.ndarray  # (vocab, dim)
    layers: list[LayerWeights]
    output_norm: np.ndarray  # (dim,)
    lm_head: np.ndarray  # (dim, vocab)


def llama_tensor_specs(config: ModelConfig) -> dict[str, TensorSpec]:
    """Every tensor a llama file must hold (or may, if optional), with the shape its config implies."""
    T = MODEL_TENSOR
    d, q, kv, f, v = config.dim, config.q_dim, config.kv_dim, config.ffn_dim, config.vocab_size
    specs = {tensor_name(T.TOKEN_EMBD): matrix(v, d)}
    for i in range(config.n_layers):
        specs |= {
            tensor_name(T.ATTN_NORM, i): norm(d),
            tensor_name(T.ATTN_Q, i): matrix(q, d),
            tensor_name(T.ATTN_K, i): matrix(kv, d),
            tensor_name(T.ATTN_V, i): matrix(kv, d),
            tensor_name(T.ATTN_OUT, i): matrix(d, q),
            tensor_name(T.FFN_NORM, i): norm(d),
            tensor_name(T.FFN_GATE, i): matrix(f, d),
            tensor_name(T.FFN_UP, i): matrix(f, d),
            tensor_name(T.FFN_DOWN, i): matrix(d, f),
        }
    specs[tensor_name(T.OUTPUT_NORM)] = norm(d)
    specs[tensor_name(T.OUTPUT)] = matrix(v, d, optional=True)
    return specs


def load_llama_weights(gguf: GGUFFile, config: ModelConfig) -> LlamaWeights:
    """Check every tensor against the llama tensor list, then dequantize them into the layout `forward` uses."""
    check_tensors(gguf, llama_tensor_specs(config))
    T = MODEL_TENSOR

    def load(tensor: MODEL_TENSOR, block: int | None = None) -> np.ndarray:
        return dequantize(gguf.tensors[tensor_name(tensor, block)])

    layers = [
        LayerWeights(
            attn_norm=load(T.ATTN_NORM, i),
            wqkv=linear_in_out(load(T.ATTN_Q, i), load(T.ATTN_K, i), load(T.ATTN_V, i)),
            wo=linear_in_out(load(T.ATTN_OUT, i)),
            ffn_norm=load(T.FFN_NORM, i),
            w_gate_up=linear_in_out(load(T.FFN_GATE, i), load(T.FFN_UP, i)),
            w_down=linear_in_out(load(T.FFN_DOWN, i)),
        )
        for i in range(config.n_layers)
    ]
    token_embd = load(T.TOKEN_EMBD)
    if tensor_name(T.OUTPUT) in gguf.tensors:
        lm_head = linear_in_out(load(T.OUTPUT))
    else:  # tied embeddings
        lm_head = np.ascontiguousarray(token_embd.T)
    return LlamaWeights(token_embd=token_embd, layers=layers, output_norm=load(T.OUTPUT_NORM), lm_head=lm_head)


class LlamaModel:
    def __init__(self, config: ModelConfig, weights: LlamaWeights):
        self.config = config
        self.weights = weights
        self.cos, self.sin = empty_rope_tables(config.head_dim)  # grown with the positions seen
        self.scale = np.float32(1.0 / np.sqrt(config.head_dim))

    @staticmethod
    def read_config(gguf: GGUFFile) -> ModelConfig:
        return ModelConfig.from_gguf(gguf)

    @classmethod
    def load(cls, gguf: GGUFFile, config: ModelConfig) -> "LlamaModel":
        return cls(config, load_llama_weights(gguf, config))

    def forward(self, step: StepInput, cache: KVCache, batch_invariant: bool = False) -> np.ndarray:
        """Run one step: write the new tokens' K/V into `cache`; return logits (R, vocab) for step.logit_rows.

        With batch_invariant every GEMM computes each row the same way whatever else is in the batch.
        """
        cfg, w = self.config, self.weights
        linear = gemm(batch_invariant)
        n_tokens = len(step.token_ids)
        self.cos, self.sin = extend_rope_tables(self.cos, self.sin, int(step.positions.max()) + 1 if n_tokens else 0,
                                                cfg.head_dim, cfg.rope_theta)
        x = w.token_embd[step.token_ids]
        normed = np.empty_like(x)
        attn_out = np.empty((n_tokens, cfg.n_heads, cfg.head_dim), dtype=np.float32)
        act = np.empty((n_tokens, cfg.ffn_dim), dtype=np.float32)
        for i, layer in enumerate(w.layers):
            kernels.rmsnorm(x, layer.attn_norm, cfg.rms_eps, normed)
            qkv = linear(normed, layer.wqkv)
            kernels.rope_and_store_kv(
                qkv, step.positions, self.cos, self.sin, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
                step.slots, cache.k[i], cache.v[i],
            )
            # a contiguous copy: numba's code for strided views is several times slower
            q = np.ascontiguousarray(qkv[:, : cfg.q_dim]).reshape(n_tokens, cfg.n_heads, cfg.head_dim)
            kernels.paged_attention(
                q, cache.k[i], cache.v[i], step.block_tables, step.positions, step.attn_items, self.scale, attn_out
            )
            x += linear(attn_out.reshape(n_tokens, cfg.q_dim), layer.wo)
            kernels.rmsnorm(x, layer.ffn_norm, cfg.rms_eps, normed)
            kernels.silu_mul(linear(normed, layer.w_gate_up), act)
            x += linear(act, layer.w_down)
        last = x[step.logit_rows]
        kernels.rmsnorm(last, w.output_norm, cfg.rms_eps, last)
        return linear(last, w.lm_head)
