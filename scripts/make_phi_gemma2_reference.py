"""llama.cpp's last-position logits for tiny random GGUFs of phi3 (Phi-3 mini; Phi-3.5 / Phi-4-mini's partial
rotary and longrope, under a context that picks the short factors and one that picks the long ones) and gemma2
(attention and final logit softcapping, alternate sliding layers, the 27B's attention scale): tests/phi_gemma2_variants.py.
The same prompts (about 20, 300 and 2,500 tokens), settings (flash attention on/off x f32/f16 KV) and output layout
as scripts/make_dense_reference.py, each variant under its own n_ctx.

Run from the repository root with the environment that has llama-cpp-python, gguf and numpy, built for the AVX2
tier (an AMX build crashed on Q8_0 on this host):

    /work/venvs/llama-avx2/bin/python scripts/make_phi_gemma2_reference.py [F32 Q8_0]

Outputs tests/fixtures/phi_gemma2_llamacpp.json and phi_gemma2_llamacpp.npz (``{variant}-{type}/{setting}/p{i}``).
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
sys.path.insert(0, str(ROOT / "scripts"))
from gguf_factory import write_tiny_model  # noqa: E402
from make_scaling_reference import PROMPTS, REFERENCE_SETTING, SETTINGS  # noqa: E402
from phi_gemma2_variants import VARIANTS, variant_context, variant_kwargs  # noqa: E402

TYPES = ("F32", "Q8_0")


def last_logits(path: Path, n_ctx: int, flash: bool, kv_type: int) -> list[np.ndarray]:
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=2, logits_all=True,
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
    out_json = ROOT / "tests" / "fixtures" / "phi_gemma2_llamacpp.json"
    arrays, variants = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for name in [f"{v}-{t}" for t in (tuple(sys.argv[1:]) or TYPES) for v in VARIANTS]:
            variant, tensor_type = name.rsplit("-", 1)
            info = write_tiny_model(Path(tmp) / f"{name}.gguf", **variant_kwargs(variant, tensor_type))
            data = info["path"].read_bytes()
            n_ctx = variant_context(variant)
            by_setting = {s: last_logits(info["path"], n_ctx, *SETTINGS[s]) for s in SETTINGS}
            for s, rows in by_setting.items():
                for i, row in enumerate(rows):
                    arrays[f"{name}/{s}/p{i}"] = row
            ref = by_setting[REFERENCE_SETTING]
            spread = [max(float(np.abs(by_setting[s][i] - ref[i]).max()) for s in SETTINGS) for i in range(len(PROMPTS))]
            variants.append({"name": name, "variant": variant, "tensor_type": tensor_type, "context": n_ctx,
                             "sha256": hashlib.sha256(data).hexdigest(), "file_size": len(data),
                             "spread_vs_reference": [round(x, 6) for x in spread],
                             "logit_std": [round(float(ref[i].std()), 4) for i in range(len(PROMPTS))]})
            print(name, "spread", [f"{x:.4f}" for x in spread], flush=True)
    meta = {"generator": "scripts/make_phi_gemma2_reference.py", "llama_cpp_python": llama_cpp.__version__,
            "gguf": importlib.metadata.version("gguf"), "prompts": PROMPTS,
            "settings": {s: {"flash_attn": f, "kv": "f32" if t == llama_cpp.GGML_TYPE_F32 else "f16"}
                         for s, (f, t) in SETTINGS.items()},
            "reference_setting": REFERENCE_SETTING, "variants": variants}
    out_json.write_text(json.dumps(meta, indent=1) + "\n")
    np.savez_compressed(out_json.with_suffix(".npz"), **arrays)
    print("wrote", out_json)


if __name__ == "__main__":
    main()
