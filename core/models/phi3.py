"""Phi-3 (Phi-3 and Phi-3.5 mini, Phi-4-mini): llama.cpp's phi3 graph, which is llama's forward pass over fused
layers, so the class is the llama family's with its own tensors and RoPE.

What differs from llama: the file holds Q, K and V as one matrix (attn_qkv, rows q | k | v) and the
feed-forward's gate and up as one (ffn_up, 2 x feed_forward_length rows, gate first): exactly the fused layers
llama's forward pass already runs (a file with separate attn_q/attn_k/attn_v, which llama.cpp also reads, loads
them fused as llama does). RoPE rotates NEOX halves of the first rope.dimension_count dimensions of each head
(Phi-4-mini: 96 of 128; the rest pass unrotated). The long-context models (Phi-3 128k, Phi-3.5, Phi-4-mini) carry
longrope: per-pair frequency factors rope_factors_long and rope_factors_short, and rope.scaling.attn_factor, by
which cos and sin are multiplied (ext_factor 0: no YaRN ramp). Which factors apply is fixed by the context the
model is run with, as llama.cpp's get_rope_factors fixes it: the long ones where that context (miro: the engine's
max_model_len, config.n_ctx; llama.cpp: n_ctx_seq) exceeds rope.scaling.original_context_length, else the short
ones, whatever a prompt's length. (llama.cpp rounds its context up to a multiple of 256 first; the published
original contexts, 4096, are such multiples, so the two choose alike.)

attention.sliding_window (Phi-3 mini: 2047; 0 marks Phi-4) is read and not applied: llama.cpp disables Phi's
sliding window (its phi3 loader sets no SWA, llama.cpp PR 13676), so every layer attends over the whole context.
"""

from __future__ import annotations

import dataclasses

from gguf import Keys

from miro.core.loading.model_config import ModelConfig
from miro.core.errors import ModelFileError
from miro.core.loading.gguf_file import GGUFFile
from miro.core.layers.rope import RopeParams, RopeTable
from miro.core.loading.weights import TensorSpec, bias_spec, check_tensors, matrix, tensor_name
from miro.core.models.common import T, Loader, embedding_and_head_specs, norm_specs
from miro.core.models.llama import LlamaLayer, LlamaModel


def phi3_tensor_specs(gguf: GGUFFile, config: ModelConfig) -> dict[str, TensorSpec]:
    """Fused attn_qkv where the file has it (every converter writes it), else separate Q, K and V; the fused
    gate/up; the optional longrope factors, (rope.dimension_count / 2,) each."""
    d, q, kv, f = config.dim, config.q_dim, config.kv_dim, config.ffn_dim
    fused = tensor_name(T.ATTN_QKV, 0) in gguf.tensors
    specs = embedding_and_head_specs(config)
    specs[tensor_name(T.ROPE_FACTORS_LONG)] = bias_spec(config.rope_dim // 2)
    specs[tensor_name(T.ROPE_FACTORS_SHORT)] = bias_spec(config.rope_dim // 2)
    for i in range(config.n_layers):
        specs |= norm_specs(config, i, T.ATTN_NORM, T.FFN_NORM)
        if fused:
            specs[tensor_name(T.ATTN_QKV, i)] = matrix(q + 2 * kv, d)
        else:
            specs |= {
                tensor_name(T.ATTN_Q, i): matrix(q, d),
                tensor_name(T.ATTN_K, i): matrix(kv, d),
                tensor_name(T.ATTN_V, i): matrix(kv, d),
            }
        specs |= {
            tensor_name(T.ATTN_OUT, i): matrix(d, q),
            tensor_name(T.FFN_UP, i): matrix(2 * f, d),
            tensor_name(T.FFN_DOWN, i): matrix(d, f),
        }
    return specs


def uses_long_factors(config: ModelConfig) -> bool:
    """llama.cpp's get_rope_factors: the long factors where the context the model runs with exceeds the
    original one (n_ctx_seq > n_ctx_orig_yarn)."""
    return (config.n_ctx or config.context_length) > (config.rope_orig_context or config.context_length)


class Phi3Model(LlamaModel):
    """Phi-3: llama's forward pass (inherited) over its fused layers, partial NEOX RoPE and longrope's factors."""

    rope_neox = True
    metadata_keys = frozenset({Keys.Attention.SLIDING_WINDOW})  # read, not applied: llama.cpp disables it for phi3

    @classmethod
    def tensor_specs(cls, gguf: GGUFFile, config: ModelConfig) -> dict[str, TensorSpec]:
        return phi3_tensor_specs(gguf, config)

    @classmethod
    def read_config(cls, gguf: GGUFFile) -> ModelConfig:
        config = ModelConfig.from_gguf(gguf, partial_rotary=True, longrope=True)
        if config.q_dim != config.dim:  # llama.cpp's phi3 tensors are n_embd wide: heads tile the embedding
            raise ModelFileError(
                f"{gguf.path}: phi3 needs n_heads x head_dim ({config.q_dim}) equal to "
                f"embedding_length ({config.dim}), as llama.cpp's phi3 graph does."
            )
        return dataclasses.replace(config, rope_neox=True)

    def __init__(self, config: ModelConfig, loader: Loader):
        gguf = loader.gguf
        check_tensors(gguf, self.tensor_specs(gguf, config), config.architecture)
        fused = tensor_name(T.ATTN_QKV, 0) in gguf.tensors
        self.layers = [
            LlamaLayer(
                attn_norm=loader.norm(T.ATTN_NORM, i),
                wqkv=loader.linear(T.ATTN_QKV, block=i)
                if fused
                else loader.linear(T.ATTN_Q, T.ATTN_K, T.ATTN_V, block=i),
                qkv_bias=None,
                q_norm=None,
                k_norm=None,
                wo=loader.linear(T.ATTN_OUT, block=i),
                wo_bias=None,
                ffn_norm=loader.norm(T.FFN_NORM, i),
                w_gate_up=loader.linear(T.FFN_UP, block=i),  # 2 x ffn_dim rows: gate, then up (ggml_swiglu's halves)
                gate_up_bias=None,
                w_down=loader.linear(T.FFN_DOWN, block=i),
                down_bias=None,
            )
            for i in range(config.n_layers)
        ]
        self._load_embedding_and_head(config, loader)
        self.long_factors = uses_long_factors(config)
        factors = tensor_name(T.ROPE_FACTORS_LONG if self.long_factors else T.ROPE_FACTORS_SHORT)
        self.rope = RopeTable(config.rope(), loader.vector(factors) if factors in gguf.tensors else None)
        self.no_rope = RopeTable(RopeParams(theta=config.rope_theta, n_rot=0))
