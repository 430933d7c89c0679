"""The next dense architectures run as llama.cpp runs them: smollm3, granite, olmo2 and mistral3.

tests/fixtures/dense_llamacpp.{json,npz} come from scripts/make_dense_reference.py: tiny random GGUFs
(gguf_factory.write_tiny_model, seeded, so the files below are byte-identical to the ones llama.cpp ran) of
SmolLM3 (every fourth layer unrotated), Granite (its embedding, residual, attention and logit multipliers; and
without RoPE), OLMo 2 (post-norms, whole-vector q/k norms), OLMo 3 (sliding window, YaRN on the global layers),
Mistral Small 3.x and Ministral 3 (YaRN betas and log multiplier, attention temperature); llama.cpp's
last-position logits for prompts of about 20, 300 and 2,500 tokens under flash attention on/off and f32/f16 KV,
in F32 and Q8_0 files. miro's logits must lie within 1.5x llama.cpp's own spread across those settings (plus,
for Q8_0, a floor for the activation rounding of quantized matmuls, which every llama.cpp setting shares and
miro's f32 weights do not), as tests/core/test_model_reach.py holds the earlier layouts.
"""

import hashlib
import json

import numpy as np
import pytest
from dense_variants import variant_kwargs
from fixture_files import FIXTURES
from gguf_factory import write_tiny_model

from miro.core import Engine

REF = json.loads((FIXTURES / "dense_llamacpp.json").read_text())
LOGITS = np.load(FIXTURES / "dense_llamacpp.npz")
VARIANTS = {v["name"]: v for v in REF["variants"]}
SPREAD_MULTIPLE = 1.5
Q8_FLOOR = 0.02


def allowed(v: dict, i: int) -> float:
    return SPREAD_MULTIPLE * v["spread_vs_reference"][i] + (0.0 if v["tensor_type"] == "F32" else Q8_FLOOR)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dense")
    out = {}
    for name, v in VARIANTS.items():
        info = write_tiny_model(folder / f"{name}.gguf", **variant_kwargs(v["variant"], v["tensor_type"]))
        assert hashlib.sha256(info["path"].read_bytes()).hexdigest() == v["sha256"], f"{name}: not the file llama.cpp ran"
        out[name] = info["path"]
    return out


def test_the_fixture_covers_every_architecture_in_both_types():
    assert {(v["variant"].split("-")[0], v["tensor_type"]) for v in VARIANTS.values()} >= {
        (a, t) for a in ("smollm3", "granite", "olmo2", "olmo3", "mistral3", "ministral3") for t in ("F32", "Q8_0")}
    assert [len(p) for p in REF["prompts"]] == [20, 300, 2500]


def cases():
    for name, v in VARIANTS.items():
        for weights in (("f32", "native") if v["tensor_type"] != "F32" else ("f32",)):
            yield pytest.param(name, weights, id=f"{name}-{weights}")


@pytest.mark.parametrize("name, weights", list(cases()))
def test_last_logits_within_llamacpps_own_spread(files, name, weights):
    v = VARIANTS[name]
    engine = Engine.from_model(files[name], weights=weights, max_model_len=REF["context"])
    for i, prompt in enumerate(REF["prompts"]):
        ours = engine.logits(prompt)
        ref = LOGITS[f"{name}/{REF['reference_setting']}/p{i}"]
        diff = float(np.abs(ours - ref).max())
        print(f"{name} {weights} p{i} ({len(prompt)} tokens): {diff:.5f} (llama.cpp's spread "
              f"{v['spread_vs_reference'][i]:.5f})")
        assert diff <= allowed(v, i), (
            f"{name} {weights}: prompt of {len(prompt)} tokens off by {diff:.4f}, more than {SPREAD_MULTIPLE}x "
            f"llama.cpp's own spread ({v['spread_vs_reference'][i]:.4f})")
