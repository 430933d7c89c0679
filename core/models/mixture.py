"""What the mixture-of-experts architectures share on the model side: their expert keys read as llama.cpp reads
them, their expert tensors' specs, and loading one layer's experts (core/layers/moe.py runs them).

llama.cpp's loaders read {arch}.expert_count and {arch}.expert_used_count (0 < used <= count); the experts' width is
feed_forward_length (llama, olmoe, granitemoe) or expert_feed_forward_length (qwen3moe: falling back to
feed_forward_length / used when absent or 0; gpt-oss: required), a shared expert's expert_shared_feed_forward_length
(granitemoe). expert_weights_norm, expert_weights_scale and expert_gating_func are not read by these architectures:
the gating and the renormalisation are fixed per architecture (scripts/moe_math.md), so the model class says them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from gguf import Keys

from miro.core.errors import ModelFileError
from miro.core.layers.moe import Experts
from miro.core.loading.gguf_file import GGUFFile
from miro.core.loading.model_config import ModelConfig
from miro.core.loading.weights import TensorSpec, bias_name, matrix, tensor_name
from miro.core.models.common import T, Loader

MAX_EXPERTS = 512  # llama.cpp's LLAMA_MAX_EXPERTS
EXPERT_KEYS = frozenset({Keys.LLM.EXPERT_COUNT, Keys.LLM.EXPERT_USED_COUNT})


def read_expert_config(
    gguf: GGUFFile,
    config: ModelConfig,
    width_key: str | None = None,
    width_fallback_per_used: bool = False,
    shared_key: str | None = None,
) -> ModelConfig:
    """config with the file's experts (none where expert_count is absent or 0: a dense file).

    width_key: the key the experts' width is read from (else feed_forward_length); width_fallback_per_used:
    where that key is absent or 0, feed_forward_length / expert_used_count (qwen3moe); shared_key: the shared
    expert's width, optional (granitemoe)."""
    arch = config.architecture
    key = lambda template: template.format(arch=arch)  # noqa: E731
    n_expert = _count(gguf, key(Keys.LLM.EXPERT_COUNT), 0)
    if n_expert == 0:
        return config
    if n_expert > MAX_EXPERTS:
        raise ModelFileError(
            f"{gguf.path}: {key(Keys.LLM.EXPERT_COUNT)} is {n_expert:,}, more than the "
            f"{MAX_EXPERTS} experts llama.cpp loads."
        )
    n_used = _count(gguf, key(Keys.LLM.EXPERT_USED_COUNT), None)
    if not 0 < n_used <= n_expert:
        raise ModelFileError(
            f"{gguf.path}: {key(Keys.LLM.EXPERT_USED_COUNT)} is {n_used}, not between 1 and the {n_expert} experts."
        )
    width = _count(gguf, key(width_key), 0) if width_key else config.ffn_dim
    if width == 0 and width_fallback_per_used:
        width = config.ffn_dim // n_used
    if width == 0:
        raise ModelFileError(f"{gguf.path}: metadata key '{key(width_key)}' is missing: the experts' width.")
    shared = _count(gguf, key(shared_key), 0) if shared_key else 0
    return dataclasses.replace(
        config, n_expert=n_expert, n_expert_used=n_used, expert_ffn_dim=width, shared_ffn_dim=shared
    )


def _count(gguf: GGUFFile, key: str, default: int | None) -> int:
    value = gguf.get(key, default) if default is not None else gguf.require(key)
    if type(value) is not int or value < 0:
        shown = "a per-layer array" if isinstance(value, list) else repr(value)
        raise ModelFileError(
            f"{gguf.path}: metadata key '{key}' is {shown}; miro reads one whole number for every layer."
        )
    return value


def expert_specs(config: ModelConfig, i: int) -> dict[str, TensorSpec]:
    """Block i's router, its 3-D expert tensors (numpy order (E, rows, cols)) and, where the config has one, the
    shared expert's matrices."""
    d, f, n = config.dim, config.expert_ffn_dim, config.n_expert
    specs = {
        tensor_name(T.FFN_GATE_INP, i): matrix(n, d),
        tensor_name(T.FFN_GATE_EXP, i): TensorSpec((n, f, d)),
        tensor_name(T.FFN_UP_EXP, i): TensorSpec((n, f, d)),
        tensor_name(T.FFN_DOWN_EXP, i): TensorSpec((n, d, f)),
    }
    if config.shared_ffn_dim:
        s = config.shared_ffn_dim
        specs |= {
            tensor_name(T.FFN_GATE_SHEXP, i): matrix(s, d),
            tensor_name(T.FFN_UP_SHEXP, i): matrix(s, d),
            tensor_name(T.FFN_DOWN_SHEXP, i): matrix(d, s),
        }
    return specs


def load_experts(loader: Loader, i: int, biases: bool = False) -> Experts:
    """Block i's router and experts as stored (core/layers/moe.py); biases: the router's and the experts' F32
    biases where the file has them (gpt-oss). Counted in the loader's memory (the repacked tiles)."""
    tensors = loader.gguf.tensors

    def bias(kind):
        name = bias_name(kind, i)
        return loader.vector(name) if biases and name in tensors else None

    gate_b, up_b = bias(T.FFN_GATE_EXP), bias(T.FFN_UP_EXP)
    gate_up_b = np.concatenate([gate_b, up_b], axis=1) if gate_b is not None and up_b is not None else None
    experts = Experts(
        tensors[tensor_name(T.FFN_GATE_INP, i)],
        tensors[tensor_name(T.FFN_GATE_EXP, i)],
        tensors[tensor_name(T.FFN_UP_EXP, i)],
        tensors[tensor_name(T.FFN_DOWN_EXP, i)],
        router_bias=bias(T.FFN_GATE_INP),
        gate_up_bias=gate_up_b,
        down_bias=bias(T.FFN_DOWN_EXP),
    )
    loader.memory += experts.weight_bytes
    return experts


def active_parameters(config: ModelConfig, total: int) -> int:
    """Parameters a token runs through: the total less the experts it does not use (E - k of each layer's)."""
    per_expert = 3 * config.dim * config.expert_ffn_dim
    return total - config.n_layers * (config.n_expert - config.n_expert_used) * per_expert
