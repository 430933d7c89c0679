"""The tiny random GGUFs of issue 38's phi3 and gemma2, as write_tiny_model arguments, and the context each runs
with. scripts/make_phi_gemma2_reference.py runs them through llama.cpp; tests/core/test_phi_gemma2_reach.py writes
the same bytes again and holds miro to llama.cpp's logits.

phi3: Phi-3 mini's layout (fused attn_qkv and gate/up, whole-head NEOX RoPE, its sliding_window key, which
llama.cpp ignores). phi3-longrope: Phi-3.5 / Phi-4-mini's (partial rotary, 24 of 32 dimensions; longrope factors,
attn_factor; context 16,384 over an original 4,096) run twice: with a context of 4,096 (not past the original:
the short factors) and of 8,192 (the long ones), as llama.cpp chooses them by its context size.
gemma2: soft-capped attention scores and logits (caps small enough to bite on random weights), even layers sliding
over 64 positions; gemma2-27b-layout: the 46-layer model's attention scale 1/sqrt(dim / n_heads).
"""

from __future__ import annotations

import math

import gguf
import numpy as np
from scaling_variants import BASE, CONTEXT

U32 = gguf.GGUFValueType.UINT32


def f32(value: float) -> gguf.GGUFValue:
    return gguf.GGUFValue(value, gguf.GGUFValueType.FLOAT32)


PHI_LONG = dict(dim=128, n_heads=4, n_kv_heads=2, context_length=16384)  # head_dim 32, 24 rotated: 12 factors
_rng = np.random.default_rng(3)
LONGROPE = {
    "metadata": {
        "phi3.rope.dimension_count": gguf.GGUFValue(24, U32),
        "phi3.rope.scaling.original_context_length": gguf.GGUFValue(4096, U32),
        # the converter's sqrt(1 + ln(context / original) / ln(original))
        "phi3.rope.scaling.attn_factor": f32(math.sqrt(1 + math.log(16384 / 4096) / math.log(4096))),
    },
    "tensor_overrides": {
        "rope_factors_short.weight": (1.0 + 0.1 * _rng.random(12)).astype(np.float32),
        "rope_factors_long.weight": np.geomspace(1.0, 16.0, 12).astype(np.float32),
    },
}
GEMMA2_CAPS = {"gemma2.attn_logit_softcapping": f32(1.0), "gemma2.final_logit_softcapping": f32(2.0)}

VARIANTS = {  # name -> (write_tiny_model arguments, llama.cpp's n_ctx and miro's max_model_len)
    "phi3": (dict(arch="phi3", metadata={"phi3.attention.sliding_window": gguf.GGUFValue(2047, U32)}), CONTEXT),
    "phi3-longrope-short": (dict(arch="phi3", **PHI_LONG, **LONGROPE), 4096),
    "phi3-longrope-long": (dict(arch="phi3", **PHI_LONG, **LONGROPE), 8192),
    "gemma2": (dict(arch="gemma2", sliding_window=64, metadata=GEMMA2_CAPS), CONTEXT),
    "gemma2-27b-layout": (dict(arch="gemma2", n_layers=46, sliding_window=64, metadata=GEMMA2_CAPS), CONTEXT),
}


def variant_kwargs(name: str, tensor_type: str) -> dict:
    return {**BASE, **VARIANTS[name][0], "tensor_type": tensor_type}


def variant_context(name: str) -> int:
    return VARIANTS[name][1]
