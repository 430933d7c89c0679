"""OLMo 2 (and OLMo 3's text model, which llama.cpp runs as olmo2 with a sliding window): llama.cpp's olmo2 graph.

What differs from llama: a block normalises nothing before attention or the feed-forward; it normalises their
outputs instead (post_attention_norm, post_ffw_norm) and adds those to the residual stream. q and k each get
one RMSNorm over the whole vector, all heads together (attn_q_norm over n_heads * head_dim, attn_k_norm over
n_kv_heads * head_dim), before NEOX RoPE. The head is its own output.weight, never tied to the embedding.

Where the file gives attention.sliding_window (OLMo 3), three of every four layers slide (layer i is local unless
i % 4 == 3; attention.sliding_window_pattern may set another period or a flag per layer): their queries see the
last `sliding_window` positions, and their RoPE is the file's base unscaled (llama.cpp's olmo2 graph passes
freq_scale 1, ext_factor 0, attn_factor 1 for them, and the global base: rope.freq_base_swa is read but unused);
the global layers take the file's RoPE scaling (OLMo 3: YaRN).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from gguf import Keys

from miro.core.layers import pointwise
from miro.core.loading.model_config import ModelConfig, _positive_int
from miro.core.errors import ModelFileError
from miro.core.loading.gguf_file import GGUFFile
from miro.core.engine.kv_cache import KVCache
from miro.core.layers.linear import Linear
from miro.core.layers.rope import RopeParams, RopeTable
from miro.core.engine.step_input import StepInput
from miro.core.loading.weights import TensorSpec, check_tensors, matrix, norm, tensor_name
from miro.core.models.common import (
    T,
    Loader,
    LoadedModel,
    attention,
    attention_specs,
    embedding_and_head_specs,
    feed_forward,
    ffn_specs,
    logits,
    norm_specs,
)
from miro.core.models.gemma3 import local_layers

GLOBAL_LAYER_EVERY = 4  # llama.cpp's load_swa_pattern(ml, 4) for olmo2: layers 3, 7, 11, ... are global


@dataclass
class Olmo2Layer:
    wqkv: Linear  # dim -> q_dim + 2 * kv_dim
    q_norm: np.ndarray  # (q_dim,): over all heads of q at once
    k_norm: np.ndarray  # (kv_dim,)
    wo: Linear  # q_dim -> dim
    post_attn_norm: np.ndarray  # (dim,)
    w_gate_up: Linear  # dim -> 2 * ffn_dim: gate outputs first, then up
    w_down: Linear  # ffn_dim -> dim
    post_ffn_norm: np.ndarray  # (dim,)


def olmo2_tensor_specs(config: ModelConfig) -> dict[str, TensorSpec]:
    specs = embedding_and_head_specs(config)
    specs[tensor_name(T.OUTPUT)] = matrix(config.vocab_size, config.dim)  # required: llama.cpp's olmo2 never ties
    for i in range(config.n_layers):
        specs |= norm_specs(config, i, T.ATTN_POST_NORM, T.FFN_POST_NORM)
        specs |= {tensor_name(T.ATTN_Q_NORM, i): norm(config.q_dim), tensor_name(T.ATTN_K_NORM, i): norm(config.kv_dim)}
        specs |= attention_specs(config, i) | ffn_specs(config, i)
    return specs


class Olmo2Model(LoadedModel):
    metadata_keys = frozenset(
        {Keys.Attention.SLIDING_WINDOW, Keys.Attention.SLIDING_WINDOW_PATTERN, Keys.Rope.FREQ_BASE_SWA}
    )

    @staticmethod
    def tensor_specs(gguf: GGUFFile, config: ModelConfig) -> dict[str, TensorSpec]:
        return olmo2_tensor_specs(config)

    def __init__(self, config: ModelConfig, loader: Loader):
        check_tensors(loader.gguf, self.tensor_specs(loader.gguf, config), config.architecture)
        self.layers = [
            Olmo2Layer(
                wqkv=loader.linear(T.ATTN_Q, T.ATTN_K, T.ATTN_V, block=i),
                q_norm=loader.norm(T.ATTN_Q_NORM, i),
                k_norm=loader.norm(T.ATTN_K_NORM, i),
                wo=loader.linear(T.ATTN_OUT, block=i),
                post_attn_norm=loader.norm(T.ATTN_POST_NORM, i),
                w_gate_up=loader.linear(T.FFN_GATE, T.FFN_UP, block=i),
                w_down=loader.linear(T.FFN_DOWN, block=i),
                post_ffn_norm=loader.norm(T.FFN_POST_NORM, i),
            )
            for i in range(config.n_layers)
        ]
        self._load_embedding_and_head(config, loader)
        self.local = (
            local_layers(loader.gguf, config.architecture, config.n_layers, GLOBAL_LAYER_EVERY)
            if config.sliding_window
            else (False,) * config.n_layers
        )
        self.rope_global = RopeTable(config.rope())
        self.rope_local = RopeTable(RopeParams(theta=config.rope_theta, n_rot=config.head_dim))

    @staticmethod
    def read_config(gguf: GGUFFile) -> ModelConfig:
        config = ModelConfig.from_gguf(gguf)
        arch = config.architecture
        if config.q_dim != config.dim:  # llama.cpp's olmo2 tensors are n_embd wide: heads tile the embedding
            raise ModelFileError(
                f"{gguf.path}: {arch} needs n_heads x head_dim ({config.q_dim}) equal to "
                f"embedding_length ({config.dim}), as llama.cpp's olmo2 graph does."
            )
        window_key = Keys.Attention.SLIDING_WINDOW.format(arch=arch)
        window = _positive_int(gguf, window_key) if gguf.get(window_key, 0) != 0 else 0  # 0: no window
        if window:
            local_layers(gguf, arch, config.n_layers, GLOBAL_LAYER_EVERY)  # a bad pattern stops here
        return dataclasses.replace(config, rope_neox=True, sliding_window=window)

    def forward(self, step: StepInput, cache: KVCache) -> np.ndarray:
        """Run one step: write the new tokens' K/V into `cache`; return logits (R, vocab) for step.logit_rows."""
        cfg = self.config
        n_tokens = len(step.token_ids)
        rope_global, rope_local = self.rope_global.upto(step.positions), self.rope_local.upto(step.positions)
        x = self.token_embd(step.token_ids)
        attn_out = np.empty((n_tokens, cfg.n_heads, cfg.head_dim), dtype=np.float32)
        for i, layer in enumerate(self.layers):
            rope, window = (rope_local, cfg.sliding_window) if self.local[i] else (rope_global, 0)
            qkv = layer.wqkv(x)
            pointwise.head_rmsnorm(qkv, 0, 1, cfg.q_dim, layer.q_norm, cfg.rms_eps)  # q as one vector
            pointwise.head_rmsnorm(qkv, cfg.q_dim, 1, cfg.kv_dim, layer.k_norm, cfg.rms_eps)  # k as one vector
            h = layer.wo(attention(qkv, i, step, cache, cfg, rope, self.scale, attn_out, window))
            x += pointwise.rmsnorm(h, layer.post_attn_norm, cfg.rms_eps, h)
            h = feed_forward(x, layer.w_gate_up, layer.w_down, pointwise.silu_mul)
            x += pointwise.rmsnorm(h, layer.post_ffn_norm, cfg.rms_eps, h)
        return logits(x, step.logit_rows, self.output_norm, self.lm_head, cfg.rms_eps)
