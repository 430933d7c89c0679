"""The llama family: llama, qwen2, qwen3, smollm3, granite and mistral3, and the mixtures of experts built on them
(Mixtral-style llama files, qwen3moe, olmoe, granitemoe), one forward pass over one packed batch of tokens.

The forward pass is llama2.c's, over every token of a step at once (prefill chunks and decode tokens
together): each linear layer is one GEMM over all of them; RMSNorm and the SiLU gate are numba kernels
(core/layers/pointwise.py), RoPE with the KV-cache write and paged attention too (core/layers/attention.py,
through common.attention).

What sets the three apart is a flag each: llama rotates adjacent pairs (x[2i], x[2i + 1]); qwen2 and qwen3
rotate NEOX halves (x[i] with x[i + head_dim/2]) and add one thing to the fused q/k/v rows before RoPE:
qwen2 biases on Q, K and V, qwen3 a per-head RMSNorm of q and k (its head_dim is attention.key_length,
which need not be dim / n_heads: ModelConfig.from_gguf reads it).

A llama file may also carry what llama.cpp's llama graph reads when present: biases on Q, K, V and the
attention output and on the feed-forward's gate, up and down; and Llama 3's RoPE frequency factors
(rope_freqs.weight). RoPE scaling (linear, YaRN) and partial rotary come from the config (core/layers/rope.py).

Three more are llama's graph with a few numbers changed, each read by its class's read_config into the config:
smollm3 leaves every fourth layer unrotated (q and k of layers 3, 7, 11, ... get no RoPE: a table of no
columns); granite multiplies the embeddings by embedding_scale, each block's attention and feed-forward
outputs by residual_scale before adding them, scales attention by attention.scale, divides the logits by
logit_scale, and rotates no layer where rope.scaling.finetuned is false; mistral3 reads YaRN's betas and log
multiplier and, where the file has attention.temperature_scale (Ministral 3), multiplies each token's q by
1 + scale ln(floor(position / rope.scaling.original_context_length) + 1) after RoPE.

A mixture of experts (a config with n_expert > 0, read by core/models/mixture.py) replaces a block's feed-forward
with core/layers/moe.py's experts: a router, k of E experts per token (gating and renormalisation fixed per
architecture as llama.cpp fixes them), and granitemoe's shared expert added to their sum. olmoe's q and k norms
span the whole q and k vectors (qk_norm_whole), as olmo2's do.

Every matrix is a `Linear` (core/layers/linear.py) in one weight format: "f32" dequantizes it once into a
float32 copy; "native" keeps the file's blocks where they are (a view of the memory map) and multiplies by
them directly, llama.cpp's way. Q/K/V are fused into one layer and gate/up into another, so each
transformer block runs four. The token embedding is an `Embedding` in the same format, and a missing
output.weight means the head is tied to it (common.Loader.lm_head).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
from gguf import Keys

from miro.core.layers import pointwise
from miro.core.loading.model_config import ModelConfig, _positive_float
from miro.core.errors import ModelFileError
from miro.core.loading.gguf_file import GGUFFile
from miro.core.engine.kv_cache import KVCache
from miro.core.layers.linear import Linear
from miro.core.layers.rope import RopeParams, RopeTable
from miro.core.engine.step_input import StepInput
from miro.core.layers.moe import Experts, Routing, run_experts
from miro.core.loading.weights import TensorSpec, bias_name, bias_spec, check_tensors, matrix, norm, tensor_name
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
from miro.core.models.mixture import EXPERT_KEYS, expert_specs, load_experts, read_expert_config


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
    w_gate_up: Linear | None  # dim -> 2 * ffn_dim: gate outputs first, then up
    gate_up_bias: np.ndarray | None  # (2 * ffn_dim,): a llama file with ffn_gate/ffn_up biases
    w_down: Linear | None  # ffn_dim -> dim
    down_bias: np.ndarray | None  # (dim,): a llama file with ffn_down.bias
    experts: Experts | None = None  # a mixture-of-experts layer's router and experts (then w_gate_up, w_down None)
    shared_gate_up: Linear | None = None  # its always-on shared expert, where it has one (granitemoe)
    shared_down: Linear | None = None


def llama_tensor_specs(
    config: ModelConfig,
    has_qkv_bias: bool = False,
    has_qk_norm: bool = False,
    optional_extras: bool = False,
    optional_qkv_bias: bool = False,
    qk_norm_whole: bool = False,
) -> dict[str, TensorSpec]:
    """Every tensor a file of the family must hold (or may, if optional), with the shape its config implies.
    optional_extras: the llama graph's optional biases and RoPE frequency factors; optional_qkv_bias: only
    the biases on Q, K and V (smollm3); qk_norm_whole: the q/k norms span the whole q and k vectors (olmoe).
    A config with experts has a router and expert tensors (mixture.expert_specs) in place of the feed-forward."""
    specs = embedding_and_head_specs(config)
    if optional_extras:
        specs[tensor_name(T.ROPE_FREQS)] = bias_spec((config.rope_dim or config.head_dim) // 2)
    for i in range(config.n_layers):
        specs |= norm_specs(config, i, T.ATTN_NORM, T.FFN_NORM) | attention_specs(config, i)
        if has_qk_norm:
            specs |= (
                qk_norm_specs(config, i)
                if not qk_norm_whole
                else {
                    tensor_name(T.ATTN_Q_NORM, i): norm(config.q_dim),
                    tensor_name(T.ATTN_K_NORM, i): norm(config.kv_dim),
                }
            )
        specs |= expert_specs(config, i) if config.n_expert else ffn_specs(config, i)
        if has_qkv_bias or optional_extras or optional_qkv_bias:
            optional = optional_extras or optional_qkv_bias
            specs |= {
                bias_name(T.ATTN_Q, i): bias_spec(config.q_dim, optional),
                bias_name(T.ATTN_K, i): bias_spec(config.kv_dim, optional),
                bias_name(T.ATTN_V, i): bias_spec(config.kv_dim, optional),
            }
        if optional_extras:
            specs[bias_name(T.ATTN_OUT, i)] = bias_spec(config.dim)
        if optional_extras and not config.n_expert:
            specs |= {
                bias_name(T.FFN_GATE, i): bias_spec(config.ffn_dim),
                bias_name(T.FFN_UP, i): bias_spec(config.ffn_dim),
                bias_name(T.FFN_DOWN, i): bias_spec(config.dim),
            }
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
    optional_qkv_bias = False  # optional biases on Q, K and V only (smollm3)
    no_rope_every = 0  # > 0: layers i with (i + 1) % no_rope_every == 0 get no RoPE (smollm3: 4)
    qk_norm_whole = False  # the q/k RMSNorm over the whole q and k vectors, not per head (olmoe)
    # Experts (core/models/mixture.py): whether the architecture reads them, where its experts' width and its shared
    # expert's are, and how it routes (llama.cpp fixes gating and renormalisation per architecture)
    has_experts = True  # llama: Mixtral-style files (llama.expert_count > 0)
    expert_width_key: str | None = None  # None: feed_forward_length
    expert_width_fallback = False  # where that key is absent or 0: feed_forward_length / expert_used_count
    shared_expert_key: str | None = None
    expert_gating, expert_normalize = "softmax", True
    metadata_keys = EXPERT_KEYS

    @classmethod
    def tensor_specs(cls, gguf: GGUFFile, config: ModelConfig) -> dict[str, TensorSpec]:
        return llama_tensor_specs(
            config, cls.has_qkv_bias, cls.has_qk_norm, cls.optional_extras, cls.optional_qkv_bias, cls.qk_norm_whole
        )

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
                **(
                    self._load_experts(config, loader, i)
                    if config.n_expert
                    else dict(
                        w_gate_up=loader.linear(T.FFN_GATE, T.FFN_UP, block=i),
                        gate_up_bias=load_biases(loader, i, T.FFN_GATE, T.FFN_UP),
                        w_down=loader.linear(T.FFN_DOWN, block=i),
                        down_bias=load_biases(loader, i, T.FFN_DOWN),
                    )
                ),
            )
            for i in range(config.n_layers)
        ]
        self.routing = (
            Routing(config.n_expert_used, self.expert_gating, self.expert_normalize) if config.n_expert else None
        )
        self._load_embedding_and_head(config, loader)
        freqs = tensor_name(T.ROPE_FREQS)
        self.rope = RopeTable(config.rope(), loader.vector(freqs) if freqs in loader.gguf.tensors else None)
        self.no_rope = RopeTable(RopeParams(theta=config.rope_theta, n_rot=0))  # no columns: nothing rotates

    @staticmethod
    def _load_experts(config: ModelConfig, loader: Loader, i: int) -> dict:
        """Block i's feed-forward fields for a mixture of experts: its experts, and its shared expert if any."""
        shared = config.shared_ffn_dim > 0
        return dict(
            w_gate_up=None,
            gate_up_bias=None,
            w_down=None,
            down_bias=None,
            experts=load_experts(loader, i),
            shared_gate_up=loader.linear(T.FFN_GATE_SHEXP, T.FFN_UP_SHEXP, block=i) if shared else None,
            shared_down=loader.linear(T.FFN_DOWN_SHEXP, block=i) if shared else None,
        )

    @classmethod
    def read_config(cls, gguf: GGUFFile) -> ModelConfig:
        config = dataclasses.replace(ModelConfig.from_gguf(gguf), rope_neox=cls.rope_neox)
        if cls.has_experts:
            config = read_expert_config(
                gguf, config, cls.expert_width_key, cls.expert_width_fallback, cls.shared_expert_key
            )
        if cls.no_rope_every:
            unrotated = tuple(i for i in range(config.n_layers) if (i + 1) % cls.no_rope_every == 0)
            config = dataclasses.replace(config, unrotated_layers=unrotated)
        return config

    def forward(self, step: StepInput, cache: KVCache) -> np.ndarray:
        """Run one step: write the new tokens' K/V into `cache`; return logits (R, vocab) for step.logit_rows."""
        return logits(
            self._blocks(step, cache),
            step.logit_rows,
            self.output_norm,
            self.lm_head,
            self.config.rms_eps,
            logit_scale=self.config.logit_scale,
        )

    def hidden_states(self, step: StepInput, cache: KVCache) -> np.ndarray:
        """The same step's final-normed hidden state of every token (T, dim), where an embedding pools them."""
        x = self._blocks(step, cache)
        pointwise.rmsnorm(x, self.output_norm, self.config.rms_eps, x)
        return x

    def _blocks(self, step: StepInput, cache: KVCache) -> np.ndarray:
        """The transformer blocks over the step's tokens: the residual stream after the last one (T, dim)."""
        cfg = self.config
        n_tokens = len(step.token_ids)
        rope, no_rope = self.rope.upto(step.positions), self.no_rope.upto(step.positions)
        q_scale = attention_temperature(step.positions, cfg) if cfg.attn_temperature_scale else None
        residual = np.float32(cfg.residual_scale)
        x = self.token_embd(step.token_ids)
        if cfg.embedding_scale != 1.0:
            x *= np.float32(cfg.embedding_scale)
        normed = np.empty_like(x)
        attn_out = np.empty((n_tokens, cfg.n_heads, cfg.head_dim), dtype=np.float32)
        h = None  # each block's output, added to the residual stream x by the next norm
        for i, layer in enumerate(self.layers):
            pointwise.add_rmsnorm(x, h, layer.attn_norm, cfg.rms_eps, normed)  # x += h; normed = RMSNorm(x)
            qkv = layer.wqkv(normed)
            if layer.qkv_bias is not None:
                qkv += layer.qkv_bias
            if self.qk_norm_whole:
                pointwise.head_rmsnorm(qkv, 0, 1, cfg.q_dim, layer.q_norm, cfg.rms_eps)  # q as one vector
                pointwise.head_rmsnorm(qkv, cfg.q_dim, 1, cfg.kv_dim, layer.k_norm, cfg.rms_eps)  # k as one vector
            elif self.has_qk_norm:
                qk_norm(qkv, layer.q_norm, layer.k_norm, cfg)
            layer_rope = no_rope if i in cfg.unrotated_layers else rope
            h = layer.wo(
                attention(qkv, i, step, cache, cfg, layer_rope, self.scale, attn_out, q_scale=q_scale), layer.wo_bias
            )
            pointwise.add_rmsnorm(x, scaled(h, residual), layer.ffn_norm, cfg.rms_eps, normed)
            if layer.experts is not None:
                h = run_experts(normed, layer.experts, self.routing, pointwise.silu_mul)
                if layer.shared_gate_up is not None:  # granitemoe: added before the residual scale
                    h += feed_forward(normed, layer.shared_gate_up, layer.shared_down, pointwise.silu_mul)
            else:
                h = feed_forward(
                    normed, layer.w_gate_up, layer.w_down, pointwise.silu_mul, layer.gate_up_bias, layer.down_bias
                )
            h = scaled(h, residual)
        if h is not None:
            x += h  # the last block's
        return x


def scaled(h: np.ndarray, scale: np.float32) -> np.ndarray:
    """h times scale, in place (granite's residual_scale); h itself where the scale is 1."""
    if scale != 1.0:
        h *= scale
    return h


def attention_temperature(positions: np.ndarray, config: ModelConfig) -> np.ndarray:
    """Each token's q multiplier where the file sets attention.temperature_scale (mistral3: Llama 4's
    temperature tuning), as llama.cpp computes it: 1 + scale ln(floor(position / original context) + 1)."""
    floor = np.floor_divide(positions, config.rope_orig_context or config.context_length).astype(np.float64)
    return (np.log(floor + 1.0) * config.attn_temperature_scale + 1.0).astype(np.float32)


def _scale_key(gguf: GGUFFile, key: str, default: float) -> float:
    """A granite/mistral3 multiplier: a finite number, `default` where absent; 0 means absent, as llama.cpp
    treats it."""
    value = gguf.get(key, default)
    if type(value) not in (int, float) or not math.isfinite(value):
        raise ModelFileError(f"{gguf.path}: metadata key '{key}' is {value!r}, not a number.")
    return float(value) or default


class Qwen2Model(LlamaModel):
    has_qkv_bias, rope_neox, optional_extras = True, True, False
    has_experts, metadata_keys = False, frozenset()


class Qwen3Model(LlamaModel):
    has_qk_norm, rope_neox, optional_extras = True, True, False
    has_experts, metadata_keys = False, frozenset()


class Qwen3MoeModel(Qwen3Model):
    """Qwen3-MoE (llama.cpp's qwen3moe): qwen3's attention, experts of expert_feed_forward_length (else
    feed_forward_length / expert_used_count), softmax over all experts, the top k renormalised."""

    has_experts, expert_width_key, expert_width_fallback = True, Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, True
    metadata_keys = EXPERT_KEYS | {Keys.LLM.EXPERT_FEED_FORWARD_LENGTH}


class OlmoeModel(LlamaModel):
    """OLMoE (llama.cpp's olmoe): llama's pre-norm blocks, q and k each RMS-normed over the whole vector, NEOX
    RoPE, an untied head, softmax over all experts and the top k NOT renormalised."""

    has_qk_norm, qk_norm_whole, rope_neox, optional_extras = True, True, True, False
    expert_normalize = False

    @classmethod
    def tensor_specs(cls, gguf: GGUFFile, config: ModelConfig) -> dict[str, TensorSpec]:
        specs = super().tensor_specs(gguf, config)
        specs[tensor_name(T.OUTPUT)] = matrix(config.vocab_size, config.dim)  # required: llama.cpp's olmoe never ties
        return specs

    @classmethod
    def read_config(cls, gguf: GGUFFile) -> ModelConfig:
        config = super().read_config(gguf)
        if config.q_dim != config.dim or config.kv_dim != config.dim:  # olmoe's q/k norms are n_embd wide
            raise ModelFileError(
                f"{gguf.path}: olmoe needs n_heads x head_dim and n_kv_heads x head_dim equal to "
                f"embedding_length ({config.dim}), as llama.cpp's olmoe graph does."
            )
        return config


class SmolLM3Model(LlamaModel):
    """SmolLM3: llama with no RoPE on every fourth layer (llama.cpp's n_no_rope_layer_step, fixed at 4: no key
    sets it); llama.cpp's smollm3 tensors are llama's less rope_freqs and every bias but Q, K and V's."""

    optional_extras, optional_qkv_bias, no_rope_every = False, True, 4
    has_experts, metadata_keys = False, frozenset()


class GraniteModel(LlamaModel):
    """IBM Granite 3.x (dense): llama with its multipliers (llama.cpp's granite graph)."""

    metadata_keys = frozenset(
        {
            Keys.LLM.LOGIT_SCALE,
            Keys.LLM.RESIDUAL_SCALE,
            Keys.LLM.EMBEDDING_SCALE,
            Keys.Attention.SCALE,
            Keys.Rope.SCALING_FINETUNED,
        }
    )
    has_experts = False

    @classmethod
    def read_config(cls, gguf: GGUFFile) -> ModelConfig:
        config = super().read_config(gguf)
        arch = config.architecture
        key = lambda template: template.format(arch=arch)  # noqa: E731
        rotates = gguf.get(key(Keys.Rope.SCALING_FINETUNED), True)  # granite's switch for RoPE, llama.cpp reads
        if type(rotates) is not bool:
            raise ModelFileError(
                f"{gguf.path}: metadata key '{key(Keys.Rope.SCALING_FINETUNED)}' is {rotates!r}, not true or false."
            )
        return dataclasses.replace(
            config,
            logit_scale=_positive_float(gguf, key(Keys.LLM.LOGIT_SCALE)),  # required, as llama.cpp requires it
            residual_scale=_scale_key(gguf, key(Keys.LLM.RESIDUAL_SCALE), 1.0),
            embedding_scale=_scale_key(gguf, key(Keys.LLM.EMBEDDING_SCALE), 1.0),
            attention_scale=_scale_key(gguf, key(Keys.Attention.SCALE), 0.0),
            unrotated_layers=() if rotates else tuple(range(config.n_layers)),
        )


class GraniteMoeModel(GraniteModel):
    """IBM Granite 3.x MoE (llama.cpp's granitemoe: granite's graph with experts, and Granite MoE Shared's
    always-on shared expert where expert_shared_feed_forward_length is set). Unlike dense granite its loader
    reads no rope.scaling.finetuned switch: every layer rotates."""

    has_experts, shared_expert_key = True, Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH
    metadata_keys = GraniteModel.metadata_keys | EXPERT_KEYS | {Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH}

    @classmethod
    def read_config(cls, gguf: GGUFFile) -> ModelConfig:
        return dataclasses.replace(super().read_config(gguf), unrotated_layers=())


class Mistral3Model(LlamaModel):
    """Mistral Small 3.x's and Ministral 3's text model: llama's graph, plus YaRN's betas and log multiplier
    and Llama 4's attention temperature where the file gives them (llama.cpp's mistral3 graph)."""

    metadata_keys = frozenset(
        {
            Keys.Rope.SCALING_YARN_BETA_FAST,
            Keys.Rope.SCALING_YARN_BETA_SLOW,
            Keys.Rope.SCALING_YARN_LOG_MUL,
            Keys.Attention.TEMPERATURE_SCALE,
        }
    )
    has_experts = False

    @classmethod
    def read_config(cls, gguf: GGUFFile) -> ModelConfig:
        config = super().read_config(gguf)
        key = lambda template: template.format(arch=config.architecture)  # noqa: E731
        return dataclasses.replace(
            config,
            rope_yarn_beta_fast=_positive_float(gguf, key(Keys.Rope.SCALING_YARN_BETA_FAST), default=32.0),
            rope_yarn_beta_slow=_positive_float(gguf, key(Keys.Rope.SCALING_YARN_BETA_SLOW), default=1.0),
            rope_yarn_log_mul=_scale_key(gguf, key(Keys.Rope.SCALING_YARN_LOG_MUL), 0.0),
            attn_temperature_scale=_scale_key(gguf, key(Keys.Attention.TEMPERATURE_SCALE), 0.0),
        )
