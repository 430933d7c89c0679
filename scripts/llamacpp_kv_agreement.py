"""How far llama.cpp agrees with itself on the default model's last-position top-1, by KV cache type.

    VENV/bin/python scripts/llamacpp_kv_agreement.py    # the environment with llama-cpp-python

Runs the 20 prompts of tests/fixtures/hf_reference.json through llama.cpp three ways (its default f16 KV
cache; an f32 one; f16 with flash attention) and prints, for each, on how many prompts its top-1 equals
the one recorded in tests/fixtures/llamacpp_reference.json (made with llama.cpp's defaults) and the f32
run's. tests/core/test_weight_formats.py holds miro's native weights to that spread.
"""

from __future__ import annotations

import json
from pathlib import Path

import llama_cpp
import numpy as np
from model_cache import cached_model

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
SETTINGS = {
    "f16 KV (default)": {},
    "f32 KV": {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32},
    "f16 KV, flash attention": {"flash_attn": True},
}


def top1_ids(path: str, prompts: list[list[int]], **settings) -> np.ndarray:
    llm = llama_cpp.Llama(model_path=path, n_ctx=2048, logits_all=False, n_threads=2, verbose=False, **settings)
    tops = []
    for ids in prompts:
        llm.reset()
        llm.eval(ids)
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
        tops.append(int(logits.argmax()))
    return np.array(tops)


def main() -> None:
    prompts = [p["prompt_ids"] for p in json.loads((FIXTURES / "hf_reference.json").read_text())["prompts"]]
    recorded = np.array(
        [p["top1_id"] for p in json.loads((FIXTURES / "llamacpp_reference.json").read_text())["prompts"]]
    )
    path = str(cached_model("smollm2-135m"))
    runs = {name: top1_ids(path, prompts, **settings) for name, settings in SETTINGS.items()}
    for name, tops in runs.items():
        print(
            f"{name:<24} top-1 equal to the record: {int((tops == recorded).sum())}/{len(prompts)}, "
            f"to the f32 KV run: {int((tops == runs['f32 KV']).sum())}/{len(prompts)}"
        )


if __name__ == "__main__":
    main()
