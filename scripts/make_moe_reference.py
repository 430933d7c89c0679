"""llama.cpp's last-position logits for the tiny random mixture-of-experts GGUFs of issue 41 (scripts/moe_files.py):
Mixtral-style llama with experts, qwen3moe, olmoe, granitemoe (and Granite MoE Shared) and gpt-oss (MXFP4 experts,
attention sinks, sliding layers, YaRN). The same prompts (about 20, 300 and 2,500 tokens), settings (flash
attention on/off x f32/f16 KV) and output layout as scripts/make_dense_reference.py (scripts/llamacpp_logits.py),
all under n_ctx 4,096; YaRN's betas as llama.cpp's own defaults take them (-1: from the model).

Run from the repository root with the environment that has llama-cpp-python, gguf and numpy, built for the AVX2
tier (scripts/llamacpp_logits.py says why):

    /path/to/venv-with-llama-cpp/bin/python scripts/make_moe_reference.py [F32 F16 Q8_0]   (default: all three)

Outputs tests/fixtures/moe_llamacpp.json and moe_llamacpp.npz (``{variant}-{type}/{setting}/p{i}``: the 272 logits
of the tiny vocabulary). Per file the json holds its sha256 and size (a test writes it again with
moe_files.write_moe_model and must get those bytes), the type of its expert matrices (MXFP4 for gpt-oss whatever
the rest), and llama.cpp's spread: the largest difference of any setting from the reference one (fa0-f32).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
import llama_cpp  # noqa: E402
from llamacpp_logits import PROMPTS, REFERENCE_SETTING, SETTINGS, last_logits  # noqa: E402
from moe_files import CONTEXT, VARIANTS, write_moe_model  # noqa: E402

TYPES = ("F32", "F16", "Q8_0")
OUT = ROOT.parent / "tests" / "fixtures" / "moe_llamacpp.json"


def main(types: tuple[str, ...]) -> None:
    arrays, entries = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for tensor_type in types:
            for variant in VARIANTS:
                name = f"{variant}-{tensor_type}"
                info = write_moe_model(Path(tmp) / f"{name}.gguf", variant, tensor_type)
                data = info["path"].read_bytes()
                by_setting = {
                    s: last_logits(info["path"], *SETTINGS[s], CONTEXT, yarn_beta_fast=-1.0, yarn_beta_slow=-1.0)
                    for s in SETTINGS
                }
                for s, rows in by_setting.items():
                    for i, row in enumerate(rows):
                        arrays[f"{name}/{s}/p{i}"] = row
                ref = by_setting[REFERENCE_SETTING]
                spread = [
                    max(float(np.abs(by_setting[s][i] - ref[i]).max()) for s in SETTINGS) for i in range(len(PROMPTS))
                ]
                expert_types = sorted({t for n, t in info["tensor_types"].items() if "_exps.weight" in n})
                entries.append(
                    {
                        "name": name,
                        "variant": variant,
                        "arch": info["arch"],
                        "tensor_type": tensor_type,
                        "expert_tensor_type": "/".join(expert_types),
                        "sha256": hashlib.sha256(data).hexdigest(),
                        "file_size": len(data),
                        "spread_vs_reference": [round(x, 6) for x in spread],
                        "logit_std": [round(float(ref[i].std()), 4) for i in range(len(PROMPTS))],
                    }
                )
                print(name, "spread", [f"{x:.5f}" for x in spread], flush=True)
    meta = {
        "generator": "scripts/make_moe_reference.py",
        "writer": "scripts/moe_files.py write_moe_model",
        "llama_cpp_python": llama_cpp.__version__,
        "gguf": importlib.metadata.version("gguf"),
        "context": CONTEXT,
        "prompts": PROMPTS,
        "settings": {
            s: {"flash_attn": f, "kv": "f32" if t == llama_cpp.GGML_TYPE_F32 else "f16"}
            for s, (f, t) in SETTINGS.items()
        },
        "reference_setting": REFERENCE_SETTING,
        "variants": entries,
    }
    OUT.write_text(json.dumps(meta, indent=1) + "\n")
    np.savez_compressed(OUT.with_suffix(".npz"), **arrays)
    print("wrote", OUT)


if __name__ == "__main__":
    main(tuple(sys.argv[1:]) or TYPES)
