"""OpenAI's gpt-oss (gpt-oss-20b, gpt-oss-120b): llama.cpp's gpt-oss graph (src/models/openai-moe.cpp), as
scripts/moe_math.md states it.

What differs from llama: q, k, v and the attention output carry biases; each query head has a learned sink logit
(attn_sinks) that joins its softmax's denominator as a score with no value (the attention kernel's sinks variant);
even layers slide over the last attention.sliding_window positions (attention.sliding_window_pattern may set
another period or a flag per layer), odd ones are global, and both kinds take the file's RoPE (NEOX halves, YaRN
with llama.cpp's betas 32 and 1 whatever the file's rope.scaling.yarn_beta_* say, as llama.cpp reads none for
gpt-oss; the sliding layers' base is rope.freq_base_swa where the file has it). The pre-FFN RMSNorm is
post_attention_norm. The feed-forward is a mixture of experts (core/layers/moe.py): a router with a bias picks
the k experts of largest raw logit, their weights a softmax over those k alone, not renormalised; each expert's
gate and up (with biases) go through SwiGLU-OAI (pointwise.swiglu_oai: alpha 1.702, clamp 7), its down has a
bias. Experts are MXFP4 in every published file and run on the file's types, so their activations are rounded to
Q8_0 as llama.cpp's MXFP4 matmul rounds them. The head is its own output.weight, never tied.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from gguf import Keys

from miro.core.engine.kv_cache import KVCache
from miro.core.engine.step_input import StepInput
from miro.core.layers import pointwise
from miro.core.layers.linear import Linear
from miro.core.layers.moe import Experts, Routing, run_experts
from miro.core.layers.rope import RopeTable
from miro.core.loading.gguf_file import GGUFFile
from miro.core.loading.model_config import ModelConfig, _positive_float, _positive_int
from miro.core.loading.weights import TensorSpec, bias_name, bias_spec, check_tensors, matrix, norm, tensor_name
from miro.core.models.common import T, Loader, LoadedModel, attention, attention_specs, embedding_and_head_specs, logits
from miro.core.models.gemma3 import local_layers
from miro.core.models.llama import load_biases
from miro.core.models.mixture import EXPERT_KEYS, expert_specs, load_experts, read_expert_config

GLOBAL_LAYER_EVERY = 2  # llama.cpp's load_swa_pattern(ml, 2): even layers slide, odd ones are global
ROUTING = "softmax_topk"  # LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT, norm_w false


@dataclass
class GptOssLayer:
    attn_norm: np.ndarray  # (dim,)
    wqkv: Linear  # dim -> q_dim + 2 * kv_dim
    qkv_bias: np.ndarray | None  # (q_dim + 2 * kv_dim,)
    wo: Linear  # q_dim -> dim
    wo_bias: np.ndarray  # (dim,)
    sinks: np.ndarray  # (n_heads,): each query head's sink logit
    ffn_norm: np.ndarray  # (dim,): the file's post_attention_norm, before the experts
    experts: Experts  # router (+ bias) and experts (+ biases)


def gpt_oss_tensor_specs(config: ModelConfig) -> dict[str, TensorSpec]:
    specs = embedding_and_head_specs(config)
    specs[tensor_name(T.OUTPUT)] = matrix(config.vocab_size, config.dim)  # required: llama.cpp's gpt-oss never ties
    d, f, n = config.dim, config.expert_ffn_dim, config.n_expert
    for i in range(config.n_layers):
        specs |= {
            tensor_name(T.ATTN_NORM, i): norm(d),
            tensor_name(T.ATTN_POST_NORM, i): norm(d),
            tensor_name(T.ATTN_SINKS, i): norm(config.n_heads),
        }
        specs |= attention_specs(config, i) | expert_specs(config, i)
        specs |= {
            bias_name(T.ATTN_Q, i): bias_spec(config.q_dim),
            bias_name(T.ATTN_K, i): bias_spec(config.kv_dim),
            bias_name(T.ATTN_V, i): bias_spec(config.kv_dim),
            bias_name(T.ATTN_OUT, i): bias_spec(d, optional=False),
            bias_name(T.FFN_GATE_INP, i): bias_spec(n, optional=False),
            bias_name(T.FFN_GATE_EXP, i): TensorSpec((n, f), float_only=True),
            bias_name(T.FFN_UP_EXP, i): TensorSpec((n, f), float_only=True),
            bias_name(T.FFN_DOWN_EXP, i): TensorSpec((n, d), float_only=True),
        }
    return specs


class GptOssModel(LoadedModel):
    metadata_keys = EXPERT_KEYS | frozenset(
        {
            Keys.LLM.EXPERT_FEED_FORWARD_LENGTH,
            Keys.Attention.SLIDING_WINDOW,
            Keys.Attention.SLIDING_WINDOW_PATTERN,
            Keys.Rope.FREQ_BASE_SWA,
        }
    )

    @staticmethod
    def tensor_specs(gguf: GGUFFile, config: ModelConfig) -> dict[str, TensorSpec]:
        return gpt_oss_tensor_specs(config)

    def __init__(self, config: ModelConfig, loader: Loader):
        check_tensors(loader.gguf, self.tensor_specs(loader.gguf, config), config.architecture)
        self.layers = [
            GptOssLayer(
                attn_norm=loader.norm(T.ATTN_NORM, i),
                wqkv=loader.linear(T.ATTN_Q, T.ATTN_K, T.ATTN_V, block=i),
                qkv_bias=load_biases(loader, i, T.ATTN_Q, T.ATTN_K, T.ATTN_V),
                wo=loader.linear(T.ATTN_OUT, block=i),
                wo_bias=loader.vector(bias_name(T.ATTN_OUT, i)),
                sinks=loader.norm(T.ATTN_SINKS, i),
                ffn_norm=loader.norm(T.ATTN_POST_NORM, i),
                experts=load_experts(loader, i, biases=True),
            )
            for i in range(config.n_layers)
        ]
        self.routing = Routing(config.n_expert_used, ROUTING, normalize=False)
        self._load_embedding_and_head(config, loader)
        self.local = local_layers(loader.gguf, config.architecture, config.n_layers, GLOBAL_LAYER_EVERY)
        self.rope_global = RopeTable(config.rope())
        self.rope_local = RopeTable(config.rope(theta=config.rope_theta_local))  # scaled too, as llama.cpp's

    @staticmethod
    def read_config(gguf: GGUFFile) -> ModelConfig:
        config = ModelConfig.from_gguf(gguf)
        arch = config.architecture
        key = lambda template: template.format(arch=arch)  # noqa: E731
        window = _positive_int(gguf, key(Keys.Attention.SLIDING_WINDOW))  # required, as llama.cpp requires it
        local_layers(gguf, arch, config.n_layers, GLOBAL_LAYER_EVERY)  # a bad pattern stops here
        config = read_expert_config(gguf, config, Keys.LLM.EXPERT_FEED_FORWARD_LENGTH)
        return dataclasses.replace(
            config,
            rope_neox=True,
            sliding_window=window,
            rope_theta_local=_positive_float(gguf, key(Keys.Rope.FREQ_BASE_SWA), default=config.rope_theta),
        )

    def forward(self, step: StepInput, cache: KVCache) -> np.ndarray:
        """Run one step: write the new tokens' K/V into `cache`; return logits (R, vocab) for step.logit_rows."""
        cfg = self.config
        n_tokens = len(step.token_ids)
        rope_global, rope_local = self.rope_global.upto(step.positions), self.rope_local.upto(step.positions)
        x = self.token_embd(step.token_ids)
        normed = np.empty_like(x)
        attn_out = np.empty((n_tokens, cfg.n_heads, cfg.head_dim), dtype=np.float32)
        for i, layer in enumerate(self.layers):
            rope, window = (rope_local, cfg.sliding_window) if self.local[i] else (rope_global, 0)
            pointwise.rmsnorm(x, layer.attn_norm, cfg.rms_eps, normed)
            qkv = layer.wqkv(normed)
            if layer.qkv_bias is not None:
                qkv += layer.qkv_bias
            x += layer.wo(
                attention(qkv, i, step, cache, cfg, rope, self.scale, attn_out, window, sinks=layer.sinks),
                layer.wo_bias,
            )
            pointwise.rmsnorm(x, layer.ffn_norm, cfg.rms_eps, normed)
            x += run_experts(normed, layer.experts, self.routing, pointwise.swiglu_oai)
        return logits(x, step.logit_rows, self.output_norm, self.lm_head, cfg.rms_eps)
