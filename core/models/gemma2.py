"""Gemma 2: llama.cpp's gemma2 graph.

What differs from llama: the embedding is scaled by sqrt(dim); each block normalises its attention and
feed-forward outputs again before adding them (post_attention_norm, post_ffw_norm); the gate is GELU (tanh
form), not SiLU; RoPE rotates NEOX halves. Every attention score s is soft-capped, c * tanh(s / c), before the
softmax, c = attn_logit_softcapping (llama.cpp's default 50 where the file has none), and so are the logits,
with final_logit_softcapping (default 30). Even layers are local (attention.sliding_window_pattern may set
another period or a flag per layer): their queries see only the last attention.sliding_window positions (default
4096), and their RoPE base is rope.freq_base_swa where the file has it, else the global base; both kinds take the
file's RoPE scaling. Attention scales by 1/sqrt(head_dim), except the 46-layer 27B, which llama.cpp (as Gemma's
query_pre_attn_scalar, 144 = 4608 / 32) scales by 1/sqrt(dim / n_heads). Norm weights are multiplied as stored
(the converter folded HF's 1 + w into them). The head is always the embedding: llama.cpp's gemma2 reads no
output.weight.

Unlike gemma3: no per-head q/k norms, every other layer slides rather than five of six, the local layers keep
the global base and scaling, and the attention scores are capped.
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
from miro.core.loading.weights import TensorSpec, check_tensors, tensor_name
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

GLOBAL_LAYER_EVERY = 2  # llama.cpp's load_swa_pattern(ml, 2): odd layers are global, even ones slide
DEFAULT_SLIDING_WINDOW = 4096  # llama.cpp's n_swa for gemma2 where the file has none
DEFAULT_ATTN_SOFTCAP = 50.0  # llama.cpp's f_attn_logit_softcapping, Gemma 2's value
DEFAULT_FINAL_SOFTCAP = 30.0  # llama.cpp's f_final_logit_softcapping, Gemma 2's value
GEMMA2_27B_LAYERS = 46  # llama.cpp tells the 27B by its layer count, for its attention scale


@dataclass
class Gemma2Layer:
    attn_norm: np.ndarray  # (dim,)
    wqkv: Linear  # dim -> q_dim + 2 * kv_dim
    wo: Linear  # q_dim -> dim
    post_attn_norm: np.ndarray  # (dim,)
    ffn_norm: np.ndarray  # (dim,)
    w_gate_up: Linear  # dim -> 2 * ffn_dim: gate outputs first, then up
    w_down: Linear  # ffn_dim -> dim
    post_ffn_norm: np.ndarray  # (dim,)


def gemma2_tensor_specs(config: ModelConfig) -> dict[str, TensorSpec]:
    specs = embedding_and_head_specs(config)
    del specs[tensor_name(T.OUTPUT)]  # llama.cpp's gemma2 always ties the head: an output.weight is refused
    for i in range(config.n_layers):
        specs |= norm_specs(config, i, T.ATTN_NORM, T.ATTN_POST_NORM, T.FFN_NORM, T.FFN_POST_NORM)
        specs |= attention_specs(config, i) | ffn_specs(config, i)
    return specs


def _softcap_key(gguf: GGUFFile, key: str, default: float) -> float:
    """A softcap: a positive number (llama.cpp divides by it), `default` where absent."""
    value = gguf.get(key, default)
    if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
        raise ModelFileError(
            f"{gguf.path}: metadata key '{key}' is {value!r}, not a positive number (llama.cpp's gemma2 divides by it)."
        )
    return float(value)


class Gemma2Model(LoadedModel):
    metadata_keys = frozenset(
        {
            Keys.Attention.SLIDING_WINDOW,
            Keys.Attention.SLIDING_WINDOW_PATTERN,
            Keys.Rope.FREQ_BASE_SWA,
            Keys.LLM.ATTN_LOGIT_SOFTCAPPING,
            Keys.LLM.FINAL_LOGIT_SOFTCAPPING,
        }
    )

    @staticmethod
    def tensor_specs(gguf: GGUFFile, config: ModelConfig) -> dict[str, TensorSpec]:
        return gemma2_tensor_specs(config)

    def __init__(self, config: ModelConfig, loader: Loader):
        check_tensors(loader.gguf, self.tensor_specs(loader.gguf, config), config.architecture)
        self.layers = [
            Gemma2Layer(
                attn_norm=loader.norm(T.ATTN_NORM, i),
                wqkv=loader.linear(T.ATTN_Q, T.ATTN_K, T.ATTN_V, block=i),
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
        self.local = local_layers(loader.gguf, config.architecture, config.n_layers, GLOBAL_LAYER_EVERY)
        self.rope_global = RopeTable(config.rope())
        self.rope_local = RopeTable(config.rope(theta=config.rope_theta_local))  # scaled too, as llama.cpp's
        self.embed_scale = np.float32(math.sqrt(config.dim))

    @staticmethod
    def read_config(gguf: GGUFFile) -> ModelConfig:
        config = ModelConfig.from_gguf(gguf)
        arch = config.architecture
        key = lambda template: template.format(arch=arch)  # noqa: E731
        window = _positive_int(gguf, key(Keys.Attention.SLIDING_WINDOW), default=DEFAULT_SLIDING_WINDOW)
        local_layers(gguf, arch, config.n_layers, GLOBAL_LAYER_EVERY)  # a bad pattern stops here
        scale = 1.0 / math.sqrt(
            config.dim // config.n_heads if config.n_layers == GEMMA2_27B_LAYERS else config.head_dim
        )
        return dataclasses.replace(
            config,
            rope_neox=True,
            sliding_window=window,
            attention_scale=scale,
            rope_theta_local=_positive_float(gguf, key(Keys.Rope.FREQ_BASE_SWA), default=config.rope_theta),
            attn_logit_softcap=_softcap_key(gguf, key(Keys.LLM.ATTN_LOGIT_SOFTCAPPING), DEFAULT_ATTN_SOFTCAP),
            final_logit_softcap=_softcap_key(gguf, key(Keys.LLM.FINAL_LOGIT_SOFTCAPPING), DEFAULT_FINAL_SOFTCAP),
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
            h = layer.wo(
                attention(qkv, i, step, cache, cfg, rope, self.scale, attn_out, window, softcap=cfg.attn_logit_softcap)
            )
            x += pointwise.rmsnorm(h, layer.post_attn_norm, cfg.rms_eps, h)
            pointwise.rmsnorm(x, layer.ffn_norm, cfg.rms_eps, normed)
            h = feed_forward(normed, layer.w_gate_up, layer.w_down, pointwise.gelu_mul)
            x += pointwise.rmsnorm(h, layer.post_ffn_norm, cfg.rms_eps, h)
        return logits(x, step.logit_rows, self.output_norm, self.lm_head, cfg.rms_eps, self.softcap)
