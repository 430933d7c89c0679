"""What the llama.cpp reference scripts share (make_scaling_reference.py, make_dense_reference.py,
make_phi_gemma2_reference.py): the prompts, llama.cpp's four settings, its last-position logits for a file, and
the reference written for tests/llamacpp_reach.py.

Each script writes its tiny random files with tests/gguf_factory.py (seeded, so the tests write the same bytes
again) and calls `write_reference`: for each file and each setting (flash attention on/off x f32/f16 KV) the
logits after the last token of each prompt, and per file the largest difference of any setting from the
reference one (llama.cpp's own spread). Run under a Python with llama-cpp-python. The committed references
come from 0.3.36 built for the AVX2 tier, as the -DGGML_NATIVE=ON build crashed on quantized files on the
machine that wrote them (it enables AMX):

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \
                -DGGML_AVX512_VNNI=OFF -DGGML_AVX_VNNI=OFF" pip install llama-cpp-python==0.3.36
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import sys
import tempfile
from pathlib import Path
from typing import Callable

import llama_cpp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from gguf_factory import write_tiny_model  # noqa: E402

PROMPT_LENGTHS = (20, 300, 2500)
_rng = np.random.default_rng(38)
PROMPTS = [[int(t) for t in _rng.integers(3, 272, size=n)] for n in PROMPT_LENGTHS]  # no control tokens
SETTINGS = {  # name -> (flash attention, KV cache type)
    "fa0-f32": (False, llama_cpp.GGML_TYPE_F32),
    "fa1-f32": (True, llama_cpp.GGML_TYPE_F32),
    "fa0-f16": (False, llama_cpp.GGML_TYPE_F16),
    "fa1-f16": (True, llama_cpp.GGML_TYPE_F16),
}
REFERENCE_SETTING = "fa0-f32"
TYPES = ("F32", "Q8_0")  # F32: miro's f32 path against llama.cpp's float one; Q8_0: both weight formats


def selected_types() -> tuple[str, ...]:
    """TYPES, or those named on the command line."""
    return tuple(sys.argv[1:]) or TYPES


def last_logits(path: Path, flash: bool, kv_type: int, n_ctx: int, **llama_options) -> list[np.ndarray]:
    """llama.cpp's logits after the last token of each prompt, under one setting."""
    llm = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=n_ctx,
        n_batch=512,
        n_ubatch=512,
        n_threads=2,
        logits_all=True,
        flash_attn=flash,
        type_k=kv_type,
        type_v=kv_type,
        verbose=False,
        **llama_options,
    )
    out = []
    for prompt in PROMPTS:
        llm.reset()
        llm.eval(prompt)
        row = np.array(llm.scores[len(prompt) - 1], dtype=np.float32, copy=True)
        assert np.isfinite(row).all()
        out.append(row)
    llm.close()
    return out


def write_reference(
    out_json: Path,
    generator: str,
    variants: dict,
    variant_kwargs: Callable[[str, str], dict],
    context: int | None = None,
    context_of: Callable[[str], int] | None = None,
    **llama_options,
) -> None:
    """Every variant in every selected type through llama.cpp's settings, into out_json and its .npz: one context
    for all (`context`, recorded once) or one per variant (`context_of`, recorded with each)."""
    arrays, entries = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for name in [f"{v}-{t}" for t in selected_types() for v in variants]:
            variant, tensor_type = name.rsplit("-", 1)
            info = write_tiny_model(Path(tmp) / f"{name}.gguf", **variant_kwargs(variant, tensor_type))
            data = info["path"].read_bytes()
            n_ctx = context if context is not None else context_of(variant)
            by_setting = {s: last_logits(info["path"], *SETTINGS[s], n_ctx, **llama_options) for s in SETTINGS}
            for s, rows in by_setting.items():
                for i, row in enumerate(rows):
                    arrays[f"{name}/{s}/p{i}"] = row
            ref = by_setting[REFERENCE_SETTING]
            spread = [
                max(float(np.abs(by_setting[s][i] - ref[i]).max()) for s in SETTINGS) for i in range(len(PROMPTS))
            ]
            entry = {"name": name, "variant": variant, "tensor_type": tensor_type}
            if context is None:
                entry["context"] = n_ctx
            entries.append(
                entry
                | {
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "file_size": len(data),
                    "spread_vs_reference": [round(x, 6) for x in spread],
                    "logit_std": [round(float(ref[i].std()), 4) for i in range(len(PROMPTS))],
                }
            )
            print(name, "spread", [f"{x:.4f}" for x in spread], flush=True)
    meta = {
        "generator": generator,
        "llama_cpp_python": llama_cpp.__version__,
        "gguf": importlib.metadata.version("gguf"),
    }
    if context is not None:
        meta["context"] = context
    meta |= {
        "prompts": PROMPTS,
        "settings": {
            s: {"flash_attn": f, "kv": "f32" if t == llama_cpp.GGML_TYPE_F32 else "f16"}
            for s, (f, t) in SETTINGS.items()
        },
        "reference_setting": REFERENCE_SETTING,
        "variants": entries,
    }
    out_json.write_text(json.dumps(meta, indent=1) + "\n")
    np.savez_compressed(out_json.with_suffix(".npz"), **arrays)
    print("wrote", out_json)
