"""llama.cpp's last-position logits for tiny random GGUFs of the dense architectures issue 38 added after llama,
qwen2, qwen3 and gemma3: smollm3, granite (and granite without RoPE), olmo2 (and OLMo 3's sliding window with
YaRN) and mistral3 (Mistral Small 3.x, and Ministral 3's YaRN betas, log multiplier and attention temperature).
The same prompts (about 20, 300 and 2,500 tokens), settings (flash attention on/off x f32/f16 KV) and output
layout as scripts/make_scaling_reference.py: scripts/llamacpp_logits.py, which both use.

Run from the repository root with the environment that has llama-cpp-python, gguf and numpy, built for the AVX2
tier for Q8_0 (an AMX build crashed on Q8_0 on this host):

    /path/to/venv-with-llama-cpp/bin/python scripts/make_dense_reference.py [F32 Q8_0]

Outputs tests/fixtures/dense_llamacpp.json and dense_llamacpp.npz (``{variant}-{type}/{setting}/p{i}``).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from dense_variants import VARIANTS, variant_kwargs  # noqa: E402
from llamacpp_logits import write_reference  # noqa: E402
from scaling_variants import CONTEXT  # noqa: E402

if __name__ == "__main__":
    # YaRN's betas from the file, as llama.cpp's own default context parameters take them (-1):
    # llama-cpp-python's defaults (32, 1) would override Ministral 3's.
    write_reference(
        ROOT / "tests" / "fixtures" / "dense_llamacpp.json",
        "scripts/make_dense_reference.py",
        VARIANTS,
        variant_kwargs,
        context=CONTEXT,
        yarn_beta_fast=-1.0,
        yarn_beta_slow=-1.0,
    )
