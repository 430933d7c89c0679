"""llama.cpp's last-position logits for tiny random GGUFs in the layouts miro used to run silently wrong
(issue 38): Llama 3 frequency factors, linear and YaRN RoPE scaling, llama biases, Gemma 3's
scaled global layers, its 27B attention scale and its logit softcapping, and keys llama.cpp's llama graph
ignores. Each under llama.cpp's four settings (flash attention on/off x f32/f16 KV), so the tests can hold
miro to llama.cpp's own spread.

Run from the repository root with the environment that has llama-cpp-python, gguf and numpy (a few minutes
on 2 cores):

    /path/to/venv-with-llama-cpp/bin/python scripts/make_scaling_reference.py [F32 Q8_0]

The committed references come from llama-cpp-python 0.3.36 built for the AVX2 tier (the build flags are in
scripts/llamacpp_logits.py): the -DGGML_NATIVE=ON build crashed on every quantized file on that host (AMX).

Each of tests/scaling_variants.py's VARIANTS is tests/gguf_factory.py's ``write_tiny_model(**kwargs)`` with a fixed seed, so the file is
byte-identical on every run (its sha256 is recorded and tests/core/test_model_reach.py checks it). Prompts
are token ids of about 20, 300 and 2,500 tokens; the YaRN files' original context (1,024) lies between the
last two, so the longest prompt runs past it.

Every variant is written in F32 and in Q8_0 (TYPES; or the types given as arguments).

Outputs: tests/fixtures/scaling_llamacpp.json (settings, versions, prompts, each file's sha256 and llama.cpp's
spread) and scaling_llamacpp.npz: ``{variant}-{type}/{setting}/p{i}`` float32 (n_vocab,), the logits after
the last token of prompt i.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from llamacpp_logits import write_reference  # noqa: E402
from scaling_variants import CONTEXT, VARIANTS, variant_kwargs  # noqa: E402

if __name__ == "__main__":
    write_reference(
        ROOT / "tests" / "fixtures" / "scaling_llamacpp.json",
        "scripts/make_scaling_reference.py",
        VARIANTS,
        variant_kwargs,
        context=CONTEXT,
    )
