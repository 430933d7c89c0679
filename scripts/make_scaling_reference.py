"""llama.cpp's last-position logits for tiny random GGUFs in the layouts miro used to run silently wrong
(issue 38): Llama 3 frequency factors, linear and YaRN RoPE scaling, llama biases, Gemma 3's
scaled global layers, its 27B attention scale and its logit softcapping, and keys llama.cpp's llama graph
ignores. Each under llama.cpp's four settings (flash attention on/off x f32/f16 KV), so the tests can hold
miro to llama.cpp's own spread.

Run from the repository root with the environment that has llama-cpp-python, gguf and numpy (a few minutes
on 2 cores):

    /path/to/venv-with-llama-cpp/bin/python scripts/make_scaling_reference.py [F32 Q8_0]

The committed references come from llama-cpp-python 0.3.36 built for the AVX2 tier (../shared/notes/cpu-tiers.md):
the -DGGML_NATIVE=ON build crashed on every quantized file on this host (it enables AMX).

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

import hashlib
import importlib.metadata
import json
import sys
import tempfile
from pathlib import Path

import llama_cpp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from gguf_factory import write_tiny_model  # noqa: E402
from scaling_variants import CONTEXT, VARIANTS, variant_kwargs  # noqa: E402

PROMPT_LENGTHS = (20, 300, 2500)
SETTINGS = {  # name -> (flash attention, KV cache type)
    "fa0-f32": (False, llama_cpp.GGML_TYPE_F32), "fa1-f32": (True, llama_cpp.GGML_TYPE_F32),
    "fa0-f16": (False, llama_cpp.GGML_TYPE_F16), "fa1-f16": (True, llama_cpp.GGML_TYPE_F16),
}
REFERENCE_SETTING = "fa0-f32"


TYPES = ("F32", "Q8_0")  # F32: miro's f32 path against llama.cpp's float one; Q8_0: both weight formats
_rng = np.random.default_rng(38)
PROMPTS = [[int(t) for t in _rng.integers(3, 272, size=n)] for n in PROMPT_LENGTHS]


def selected_types() -> tuple[str, ...]:
    """TYPES, or those named on the command line (a llama.cpp built with AMX crashed on Q8_0 on this host:
    build it for the AVX2 tier, ../shared/notes/cpu-tiers.md)."""
    return tuple(sys.argv[1:]) or TYPES


def last_logits(path: Path, flash: bool, kv_type: int) -> list[np.ndarray]:
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=CONTEXT, n_batch=512, n_ubatch=512, n_threads=2, logits_all=True,
                          flash_attn=flash, type_k=kv_type, type_v=kv_type, verbose=False)
    out = []
    for prompt in PROMPTS:
        llm.reset()
        llm.eval(prompt)
        row = np.array(llm.scores[len(prompt) - 1], dtype=np.float32, copy=True)
        assert np.isfinite(row).all()
        out.append(row)
    llm.close()
    return out


def main() -> None:
    out_json = ROOT / "tests" / "fixtures" / "scaling_llamacpp.json"
    arrays, variants = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for name in [f"{v}-{t}" for t in selected_types() for v in VARIANTS]:
            variant, tensor_type = name.rsplit("-", 1)
            info = write_tiny_model(Path(tmp) / f"{name}.gguf", **variant_kwargs(variant, tensor_type))
            data = info["path"].read_bytes()
            by_setting = {s: last_logits(info["path"], *SETTINGS[s]) for s in SETTINGS}
            for s, rows in by_setting.items():
                for i, row in enumerate(rows):
                    arrays[f"{name}/{s}/p{i}"] = row
            ref = by_setting[REFERENCE_SETTING]
            spread = [max(float(np.abs(by_setting[s][i] - ref[i]).max()) for s in SETTINGS) for i in range(len(PROMPTS))]
            variants.append({"name": name, "variant": variant, "tensor_type": tensor_type, "sha256": hashlib.sha256(data).hexdigest(), "file_size": len(data),
                             "spread_vs_reference": [round(x, 6) for x in spread],
                             "logit_std": [round(float(ref[i].std()), 4) for i in range(len(PROMPTS))]})
            print(name, "spread", [f"{x:.4f}" for x in spread], flush=True)
    meta = {"generator": "scripts/make_scaling_reference.py", "llama_cpp_python": llama_cpp.__version__,
            "gguf": importlib.metadata.version("gguf"), "context": CONTEXT, "prompts": PROMPTS,
            "settings": {s: {"flash_attn": f, "kv": "f32" if t == llama_cpp.GGML_TYPE_F32 else "f16"}
                         for s, (f, t) in SETTINGS.items()},
            "reference_setting": REFERENCE_SETTING, "variants": variants}
    out_json.write_text(json.dumps(meta, indent=1) + "\n")
    np.savez_compressed(out_json.with_suffix(".npz"), **arrays)
    print("wrote", out_json)


if __name__ == "__main__":
    main()
