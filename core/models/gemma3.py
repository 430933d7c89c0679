"""Gemma 3: llama.cpp's gemma3 graph.

What differs from llama: the embedding is scaled by sqrt(dim); each block normalises its attention and
feed-forward outputs again before adding them (post_attention_norm, post_ffw_norm); q and k get a
per-head RMSNorm before NEOX RoPE; the gate is GELU (tanh form), not SiLU. Five of every six layers are
local: their queries see only the last `sliding_window` positions (attention.sliding_window_pattern may set
another period, or a flag per layer) and their RoPE base is rope.freq_base_swa, 10000 where the file has none
(the file's rope.freq_base is the global layers'); only the global layers take the file's RoPE scaling
(Gemma 3 4B-27B: linear x8). Norm weights are multiplied as stored: the converter already folded HF's (1 + w)
into them. Attention scales by 1/sqrt(head_dim), except the 62-layer 27B, which llama.cpp (as Gemma's
reference code, query_pre_attn_scalar) scales by 1/sqrt(dim / n_heads). The logits are soft-capped where
the file gives final_logit_softcapping.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
from gguf import Keys

from miro.core.layers import pointwise
from miro.core.loading.model_config import ModelConfig, _positive_float, _positive_int
from miro.core.errors import ModelFileError
from miro.core.loading.gguf_file import GGUFFile
from miro.core.engine.kv_cache import KVCache
from miro.core.layers.linear import Linear
from miro.core.layers.rope import RopeTable
from miro.core.engine.step_input import StepInput
from miro.core.loading.weights import TensorSpec, check_tensors
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
    qk_norm,
    qk_norm_specs,
)

LOCAL_ROPE_THETA = 10000.0  # llama.cpp's rope_freq_base_train_swa for gemma3 where the file has no freq_base_swa
GLOBAL_LAYER_EVERY = 6  # layers 5, 11, 17, ... are global; the others slide (unless sliding_window_pattern says)
GEMMA3_27B_LAYERS = 62  # llama.cpp tells the 27B by its layer count, for its attention scale


def is_local(layer: int, every: int = GLOBAL_LAYER_EVERY) -> bool:
    return layer % every < every - 1


def local_layers(gguf: GGUFFile, arch: str, n_layers: int, every: int = GLOBAL_LAYER_EVERY) -> tuple[bool, ...]:
    """Which layers slide: attention.sliding_window_pattern as llama.cpp's load_swa_pattern reads it (a flag per
    layer, or the period of the global layers), else every `every`th layer is global (gemma3: sixth)."""
    key = Keys.Attention.SLIDING_WINDOW_PATTERN.format(arch=arch)
    pattern = gguf.get(key, every)
    if isinstance(pattern, list):
        if len(pattern) != n_layers or any(type(p) is not bool for p in pattern):
            raise ModelFileError(f"{gguf.path}: {key} must be {n_layers} true/false flags, one per layer.")
        return tuple(pattern)
    if type(pattern) is not int or pattern < 1:
        raise ModelFileError(f"{gguf.path}: {key} is {pattern!r}, not a positive integer.")
    return tuple(is_local(i, pattern) for i in range(n_layers))


@dataclass
class Gemma3Layer:
    attn_norm: np.ndarray  # (dim,)
    wqkv: Linear  # dim -> q_dim + 2 * kv_dim
    q_norm: np.ndarray  # (head_dim,)
    k_norm: np.ndarray  # (head_dim,)
    wo: Linear  # q_dim -> dim
    post_attn_norm: np.ndarray  # (dim,)
    ffn_norm: np.ndarray  # (dim,)
    w_gate_up: Linear  # dim -> 2 * ffn_dim: gate outputs first, then up
    w_down: Linear  # ffn_dim -> dim
    post_ffn_norm: np.ndarray  # (dim,)


def gemma3_tensor_specs(config: ModelConfig) -> dict[str, TensorSpec]:
    specs = embedding_and_head_specs(config)
    for i in range(config.n_layers):
        specs |= norm_specs(config, i, T.ATTN_NORM, T.ATTN_POST_NORM, T.FFN_NORM, T.FFN_POST_NORM)
        specs |= attention_specs(config, i) | qk_norm_specs(config, i) | ffn_specs(config, i)
    return specs


class Gemma3Model(LoadedModel):
    @staticmethod
    def tensor_specs(gguf: GGUFFile, config: ModelConfig) -> dict[str, TensorSpec]:
        return gemma3_tensor_specs(config)

    def __init__(self, config: ModelConfig, loader: Loader):
        check_tensors(loader.gguf, self.tensor_specs(loader.gguf, config), config.architecture)
        self.layers = [
            Gemma3Layer(
                attn_norm=loader.norm(T.ATTN_NORM, i),
                wqkv=loader.linear(T.ATTN_Q, T.ATTN_K, T.ATTN_V, block=i),
                q_norm=loader.norm(T.ATTN_Q_NORM, i),
                k_norm=loader.norm(T.ATTN_K_NORM, i),
                wo=loader.linear(T.ATTN_OUT, block=i),
                post_attn_norm=loader.norm(T.ATTN_POST_NORM, i),
                ffn_norm=loader.norm(T.FFN_NORM, i),
                w_gate_up=loader.linear(T.FFN_GATE, T.FFN_UP, block=i),
                w_down=loader.linear(T.FFN_DOWN, block=i),
                post_ffn_norm=loader.norm(T.FFN_POST_NORM, i),
            )
            for i in range(config.n_layers)
        ]
        self._load_embedding_and_head(config, loader)
        self.local = local_layers(loader.gguf, config.architecture, config.n_layers)
        self.rope_global = RopeTable(config.rope())
        self.rope_local = RopeTable(config.rope(theta=config.rope_theta_local, scaled=False))
        self.embed_scale = np.float32(math.sqrt(config.dim))

    metadata_keys = frozenset(
        {
            Keys.Attention.SLIDING_WINDOW,
            Keys.Attention.SLIDING_WINDOW_PATTERN,
            Keys.Rope.FREQ_BASE_SWA,
            Keys.LLM.FINAL_LOGIT_SOFTCAPPING,
        }
    )

    @staticmethod
    def read_config(gguf: GGUFFile) -> ModelConfig:
        config = ModelConfig.from_gguf(gguf)
        arch = config.architecture
        window = _positive_int(gguf, Keys.Attention.SLIDING_WINDOW.format(arch=arch))
        local_layers(gguf, arch, config.n_layers)  # a bad pattern stops here, before any weight is read
        theta_local = _positive_float(gguf, Keys.Rope.FREQ_BASE_SWA.format(arch=arch), default=LOCAL_ROPE_THETA)
        softcap_key = Keys.LLM.FINAL_LOGIT_SOFTCAPPING.format(arch=arch)
        softcap = gguf.get(softcap_key, 0.0)
        if type(softcap) not in (int, float) or not math.isfinite(softcap) or softcap < 0:
            raise ModelFileError(f"{gguf.path}: metadata key '{softcap_key}' is {softcap!r}, not a number >= 0.")
        scale = 1.0 / math.sqrt(
            config.dim // config.n_heads if config.n_layers == GEMMA3_27B_LAYERS else config.head_dim
        )
        return dataclasses.replace(
            config,
            rope_neox=True,
            sliding_window=window,
            rope_theta_local=theta_local,
            attention_scale=scale,
            final_logit_softcap=float(softcap),
        )

    def forward(self, step: StepInput, cache: KVCache) -> np.ndarray:
        """Run one step: write the new tokens' K/V into `cache`; return logits (R, vocab) for step.logit_rows."""
        cfg = self.config
        n_tokens = len(step.token_ids)
        rope_global, rope_local = self.rope_global.upto(step.positions), self.rope_local.upto(step.positions)
        x = self.token_embd(step.token_ids)
        x *= self.embed_scale
        normed = np.empty_like(x)
        attn_out = np.empty((n_tokens, cfg.n_heads, cfg.head_dim), dtype=np.float32)
        for i, layer in enumerate(self.layers):
            rope, window = (rope_local, cfg.sliding_window) if self.local[i] else (rope_global, 0)
            pointwise.rmsnorm(x, layer.attn_norm, cfg.rms_eps, normed)
            qkv = layer.wqkv(normed)
            qk_norm(qkv, layer.q_norm, layer.k_norm, cfg)
            h = layer.wo(attention(qkv, i, step, cache, cfg, rope, self.scale, attn_out, window))
            x += pointwise.rmsnorm(h, layer.post_attn_norm, cfg.rms_eps, h)
            pointwise.rmsnorm(x, layer.ffn_norm, cfg.rms_eps, normed)
            h = feed_forward(normed, layer.w_gate_up, layer.w_down, pointwise.gelu_mul)
            x += pointwise.rmsnorm(h, layer.post_ffn_norm, cfg.rms_eps, h)
        return logits(x, step.logit_rows, self.output_norm, self.lm_head, cfg.rms_eps, self.softcap)
