"""The tiny random GGUFs of issue 38's next dense architectures, as write_tiny_model arguments: smollm3, granite,
olmo2 (OLMo 2, and OLMo 3's sliding window) and mistral3 (Mistral Small 3.x, and Ministral 3's YaRN and attention
temperature). scripts/make_dense_reference.py runs them through llama.cpp; tests/core/test_dense_reach.py writes
the same bytes again and holds miro to llama.cpp's logits."""

from __future__ import annotations

import gguf
from scaling_variants import BASE, CONTEXT, yarn  # noqa: F401  (CONTEXT: the scripts' n_ctx)


def f32(value: float) -> gguf.GGUFValue:
    return gguf.GGUFValue(value, gguf.GGUFValueType.FLOAT32)


MINISTRAL3 = {  # Ministral 3's converter output: YaRN with its betas, log multiplier 1 (mscale_all_dim), beta 0.1
    **yarn("mistral3", factor=4.0, original=1024),
    "mistral3.rope.scaling.yarn_beta_fast": f32(16.0),  # not llama.cpp's defaults (32, 1), so that reading them shows
    "mistral3.rope.scaling.yarn_beta_slow": f32(2.0),
    "mistral3.rope.scaling.yarn_log_multiplier": f32(1.0),
    "mistral3.attention.temperature_scale": f32(0.1),  # positions past 1,024 (the 2,500-token prompt) get q x 1.07-1.11
}
VARIANTS = {
    "smollm3": dict(arch="smollm3"),  # layer 3 of 4 unrotated
    "granite": dict(arch="granite"),  # logit 8, residual 0.22, embedding 12, attention 1/16 (gguf_factory._ARCH_KEYS)
    "granite-norope": dict(arch="granite", metadata={"granite.rope.scaling.finetuned": False}),
    "olmo2": dict(arch="olmo2"),
    "olmo3-swa": dict(arch="olmo2", n_layers=4, sliding_window=64, metadata=yarn("olmo2")),  # layers 0-2 slide
    "mistral3": dict(arch="mistral3"),  # Mistral Small 3.x: llama's graph under its own name
    "ministral3": dict(arch="mistral3", metadata=MINISTRAL3),
}


def variant_kwargs(name: str, tensor_type: str) -> dict:
    return {**BASE, **VARIANTS[name], "tensor_type": tensor_type}
