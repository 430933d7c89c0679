"""The tiny random GGUFs of issue 38's fidelity check, as write_tiny_model arguments: one per layout miro used to
run silently wrong. scripts/make_scaling_reference.py runs them through llama.cpp; tests/core/test_model_reach.py
writes the same bytes again and holds miro to llama.cpp's logits."""

from __future__ import annotations

import gguf
import numpy as np
from gguf_factory import tensor_name

MT = gguf.MODEL_TENSOR
CONTEXT = 4096


def llama3_rope_freqs(head_dim: int, theta: float, factor=8.0, low=1.0, high=4.0, original=512) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's converter writes it for a Llama 3.1 config (rope_type llama3)."""
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    low_wavelen, high_wavelen = original / low, original / high
    factors = []
    for freq in freqs:
        wavelen = 2 * np.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def llama_biases(n_layers: int, dim: int, q_dim: int, kv_dim: int, ffn_dim: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(n_layers):
        for kind, size in (
            (MT.ATTN_Q, q_dim),
            (MT.ATTN_K, kv_dim),
            (MT.ATTN_V, kv_dim),
            (MT.ATTN_OUT, dim),
            (MT.FFN_GATE, ffn_dim),
            (MT.FFN_UP, ffn_dim),
            (MT.FFN_DOWN, dim),
        ):
            out[tensor_name(kind, i, "bias")] = (0.3 * rng.standard_normal(size)).astype(np.float32)
    return out


def yarn(arch: str, factor: float = 4.0, original: int = 1024) -> dict:
    return {
        f"{arch}.rope.scaling.type": "yarn",
        f"{arch}.rope.scaling.factor": factor,
        f"{arch}.rope.scaling.original_context_length": gguf.GGUFValue(original, gguf.GGUFValueType.UINT32),
    }


def linear(arch: str, factor: float) -> dict:
    return {f"{arch}.rope.scaling.type": "linear", f"{arch}.rope.scaling.factor": factor}


BASE = dict(context_length=CONTEXT, seed=7, weight_scale=0.08)
LLAMA_WIDE = dict(dim=128, n_heads=4, n_kv_heads=2)  # head_dim 32: 16 frequency factors
VARIANTS = {
    "llama-rope-freqs": dict(
        arch="llama",
        **LLAMA_WIDE,
        rope_theta=500000.0,
        tensor_overrides={"rope_freqs.weight": llama3_rope_freqs(32, 500000.0)},
    ),
    "llama-linear4": dict(arch="llama", **LLAMA_WIDE, metadata=linear("llama", 4.0)),
    "llama-yarn4": dict(arch="llama", **LLAMA_WIDE, metadata=yarn("llama")),
    "qwen2-yarn4": dict(arch="qwen2", metadata=yarn("qwen2")),
    "qwen3-yarn4": dict(arch="qwen3", metadata=yarn("qwen3")),
    "llama-biases": dict(arch="llama", **LLAMA_WIDE, tensor_overrides=llama_biases(2, 128, 128, 64, 128, seed=3)),
    "gemma3-linear8": dict(arch="gemma3", metadata=linear("gemma3", 8.0)),
    "gemma3-27b-layout": dict(arch="gemma3", n_layers=62, metadata=linear("gemma3", 8.0)),
    "gemma3-softcap": dict(arch="gemma3", metadata={"gemma3.final_logit_softcapping": 3.0}),
    "llama-ignored-keys": dict(
        arch="llama",
        **LLAMA_WIDE,
        metadata={
            "llama.attention.scale": 0.5,
            "llama.attention.sliding_window": gguf.GGUFValue(8, gguf.GGUFValueType.UINT32),
        },
    ),
}


def variant_kwargs(name: str, tensor_type: str) -> dict:
    return {**BASE, **VARIANTS[name], "tensor_type": tensor_type}
