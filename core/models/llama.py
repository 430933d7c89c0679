"""Llama: its tensors, how they load, and its forward pass over one packed batch of tokens.

The forward pass is llama2.c's, over every token of a step at once (prefill chunks and decode tokens
together): each linear layer is one float32 GEMM over all of them; RMSNorm, RoPE with the KV-cache write,
SiLU-gate are numba kernels (core/kernels.py), RoPE with the KV write and paged attention too
(core/layers/attention.py, through common.attention).

Every matrix is a `Linear` (core/layers/linear.py) in one weight format: "f32" dequantizes it once into a
float32 copy multiplied by BLAS; "native" keeps the file's blocks where they are (a view of the memory map)
and multiplies by them directly, llama.cpp's way. Q/K/V are fused into one layer and gate/up into another,
so each transformer block runs four. The token embedding is an `Embedding` in the same format, and a
missing output.weight means the head is tied to it: a `Linear` over token_embd.
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
from ..layers.linear import Embedding, Linear, has_native_kernel, owned_bytes
from ..layers.rotary import empty_rope_tables, extend_rope_tables
from ..model_runner import StepInput
from .common import attention
from ..weights import TensorSpec, check_tensors, matrix, norm, tensor_name


@dataclass
class LayerWeights:
    attn_norm: np.ndarray  # (dim,)
    wqkv: Linear  # dim -> q_dim + 2 * kv_dim
    wo: Linear  # q_dim -> dim
    ffn_norm: np.ndarray  # (dim,)
    w_gate_up: Linear  # dim -> 2 * ffn_dim: gate outputs first, then up
    w_down: Linear  # ffn_dim -> dim


@dataclass
class LlamaWeights:
    token_embd: Embedding  # token id -> (dim,)
    layers: list[LayerWeights]
    output_norm: np.ndarray  # (dim,)
    lm_head: Linear  # dim -> vocab
    fallbacks: dict[str, str]  # type name -> why its matrices are f32 although "native" was asked for

    @property
    def memory(self) -> int:
        """Bytes the weights hold of their own (a view of the memory-mapped file holds none)."""
        arrays = [self.output_norm] + [n for layer in self.layers for n in (layer.attn_norm, layer.ffn_norm)]
        linears = [self.lm_head] + [m for layer in self.layers for m in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down)]
        return sum(owned_bytes(a) for a in arrays) + sum(m.weight_bytes for m in linears) + self.token_embd.weight_bytes


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


def load_llama_weights(gguf: GGUFFile, config: ModelConfig, weight_format: str = "f32",
                       batch_invariant: bool = False) -> LlamaWeights:
    """Check every tensor against the llama tensor list, then build the layers `forward` uses in
    `weight_format` ("f32" or "native"; a type with no native kernel stays f32, noted in `fallbacks`), f32
    matrices packed for the invariant GEMM when `batch_invariant`."""
    check_tensors(gguf, llama_tensor_specs(config))
    T = MODEL_TENSOR
    fallbacks: dict[str, str] = {}

    def tensor(kind: MODEL_TENSOR, block: int | None = None):
        return gguf.tensors[tensor_name(kind, block)]

    def load(kind: MODEL_TENSOR, block: int | None = None) -> np.ndarray:
        return dequantize(tensor(kind, block))

    def linear(*kinds: MODEL_TENSOR, block: int | None = None) -> Linear:
        parts = [tensor(kind, block) for kind in kinds]
        fmt = weight_format
        if fmt == "native" and not has_native_kernel(parts[0].type):
            fmt = "f32"
            fallbacks[parts[0].type.name] = f"{parts[0].type.name} has no native kernel: its matrices are kept as f32"
        return Linear.fused(parts, fmt, invariant=batch_invariant)

    layers = [
        LayerWeights(
            attn_norm=load(T.ATTN_NORM, i),
            wqkv=linear(T.ATTN_Q, T.ATTN_K, T.ATTN_V, block=i),
            wo=linear(T.ATTN_OUT, block=i),
            ffn_norm=load(T.FFN_NORM, i),
            w_gate_up=linear(T.FFN_GATE, T.FFN_UP, block=i),
            w_down=linear(T.FFN_DOWN, block=i),
        )
        for i in range(config.n_layers)
    ]
    lm_head = linear(T.OUTPUT if tensor_name(T.OUTPUT) in gguf.tensors else T.TOKEN_EMBD)  # else tied embeddings
    return LlamaWeights(token_embd=Embedding(tensor(T.TOKEN_EMBD), weight_format), layers=layers,
                        output_norm=load(T.OUTPUT_NORM), lm_head=lm_head, fallbacks=fallbacks)


class LlamaModel:
    def __init__(self, config: ModelConfig, weights: LlamaWeights, weight_format: str = "f32"):
        self.config = config
        self.weights = weights
        self.weight_format = weight_format  # "f32" or "native" (see weights.fallbacks for f32 exceptions)
        self.cos, self.sin = empty_rope_tables(config.head_dim)  # grown with the positions seen
        self.scale = np.float32(1.0 / np.sqrt(config.head_dim))

    @staticmethod
    def read_config(gguf: GGUFFile) -> ModelConfig:
        return ModelConfig.from_gguf(gguf)

    @classmethod
    def load(cls, gguf: GGUFFile, config: ModelConfig, weight_format: str = "f32",
             batch_invariant: bool = False) -> "LlamaModel":
        return cls(config, load_llama_weights(gguf, config, weight_format, batch_invariant), weight_format)

    @property
    def weight_memory(self) -> int:
        """Bytes the weights hold of their own; a memory-mapped native tensor holds none."""
        return self.weights.memory

    @property
    def weight_fallbacks(self) -> list[str]:
        """One sentence per tensor type kept as f32 in native mode (no native kernel for it)."""
        return list(self.weights.fallbacks.values())

    def forward(self, step: StepInput, cache: KVCache, batch_invariant: bool = False) -> np.ndarray:
        """Run one step: write the new tokens' K/V into `cache`; return logits (R, vocab) for step.logit_rows.

        With batch_invariant every GEMM computes each row the same way whatever else is in the batch.
        """
        cfg, w, inv = self.config, self.weights, batch_invariant
        n_tokens = len(step.token_ids)
        self.cos, self.sin = extend_rope_tables(self.cos, self.sin, int(step.positions.max()) + 1 if n_tokens else 0,
                                                cfg.head_dim, cfg.rope_theta)
        x = w.token_embd(step.token_ids)
        normed = np.empty_like(x)
        attn_out = np.empty((n_tokens, cfg.n_heads, cfg.head_dim), dtype=np.float32)
        act = np.empty((n_tokens, cfg.ffn_dim), dtype=np.float32)
        for i, layer in enumerate(w.layers):
            kernels.rmsnorm(x, layer.attn_norm, cfg.rms_eps, normed)
            qkv = layer.wqkv(normed, inv)
            attention(qkv, i, step, cache, cfg, (self.cos, self.sin), self.scale, attn_out)
            x += layer.wo(attn_out.reshape(n_tokens, cfg.q_dim), inv)
            kernels.rmsnorm(x, layer.ffn_norm, cfg.rms_eps, normed)
            kernels.silu_mul(layer.w_gate_up(normed, inv), act)
            x += layer.w_down(act, inv)
        last = x[step.logit_rows]
        kernels.rmsnorm(last, w.output_norm, cfg.rms_eps, last)
        return w.lm_head(last, inv)
