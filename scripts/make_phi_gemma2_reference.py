"""llama.cpp's last-position logits for tiny random GGUFs of phi3 (Phi-3 mini; Phi-3.5 / Phi-4-mini's partial
rotary and longrope, under a context that picks the short factors and one that picks the long ones) and gemma2
(attention and final logit softcapping, alternate sliding layers, the 27B's attention scale): tests/phi_gemma2_variants.py.
The same prompts (about 20, 300 and 2,500 tokens), settings (flash attention on/off x f32/f16 KV) and output layout
as scripts/make_dense_reference.py (scripts/llamacpp_logits.py), each variant under its own n_ctx.

Run from the repository root with the environment that has llama-cpp-python, gguf and numpy, built for the AVX2
tier (an AMX build crashed on Q8_0 on this host):

    /path/to/venv-with-llama-cpp/bin/python scripts/make_phi_gemma2_reference.py [F32 Q8_0]

Outputs tests/fixtures/phi_gemma2_llamacpp.json and phi_gemma2_llamacpp.npz (``{variant}-{type}/{setting}/p{i}``).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from llamacpp_logits import write_reference  # noqa: E402
from phi_gemma2_variants import VARIANTS, variant_context, variant_kwargs  # noqa: E402

if __name__ == "__main__":
    write_reference(
        ROOT / "tests" / "fixtures" / "phi_gemma2_llamacpp.json",
        "scripts/make_phi_gemma2_reference.py",
        VARIANTS,
        variant_kwargs,
        context_of=variant_context,
    )
