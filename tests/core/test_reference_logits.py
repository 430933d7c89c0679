"""The default model against two independent implementations of the same weights.

Fixtures come from scripts/make_hf_reference.py (HF transformers, float32) and
scripts/make_llamacpp_reference.py (llama.cpp through llama-cpp-python).
"""

import json

import numpy as np
import pytest
from fixture_files import FIXTURES
from reference_model import reference_logits

from miro.core import Engine, SamplingParams

HF = json.loads((FIXTURES / "hf_reference.json").read_text())
HF_LOGITS = np.load(FIXTURES / "hf_logits.npz")["logits"]
LLAMA_CPP = json.loads((FIXTURES / "llamacpp_reference.json").read_text())


@pytest.fixture(scope="module")
def engine(smollm2_path):
    """The float32 weights HF is held to, with the default KV cache (float16)."""
    engine = Engine.from_model(smollm2_path, max_model_len=1024, weights="f32")
    assert engine.kv_cache_dtype == "float16"
    return engine


@pytest.fixture(scope="module")
def float32_engine(smollm2_path):
    """Float32 all through, K and V included."""
    return Engine.from_model(smollm2_path, max_model_len=1024, weights="f32", kv_cache_dtype="float32")


@pytest.fixture(scope="module")
def miro_logits(engine):
    return np.stack([engine.logits(p["prompt_ids"]) for p in HF["prompts"]])


def test_fixtures_are_for_this_model(smollm2_path):
    from miro.core.loading.registry import ALIASES, DEFAULT_MODEL

    assert HF["model_sha256"] == ALIASES[DEFAULT_MODEL].sha256
    assert len(HF["prompts"]) == 20 and HF_LOGITS.shape == (20, 49152)


def test_chat_template_and_tokenizer_give_hf_ids(engine):
    for p in HF["prompts"]:
        text = engine.tokenizer.apply_chat_template(p["messages"], add_generation_prompt=True)
        assert text == p["prompt_text"]
        assert engine.tokenizer.encode(text, special=True) == p["prompt_ids"]


def test_logits_match_hf_float32(miro_logits):
    diff = np.abs(miro_logits - HF_LOGITS).max(axis=1)
    print(f"f32 weights, float16 KV cache: max abs logit diff from HF {diff.max():.4f}")
    assert diff.max() < 0.02, diff
    assert np.array_equal(miro_logits.argmax(axis=1), HF_LOGITS.argmax(axis=1))


def test_a_float32_kv_cache_matches_hf_closer_still(float32_engine):
    logits = np.stack([float32_engine.logits(p["prompt_ids"]) for p in HF["prompts"]])
    diff = np.abs(logits - HF_LOGITS).max()
    print(f"f32 weights, float32 KV cache: max abs logit diff from HF {diff:.5f}")
    assert diff < 1e-3


def test_greedy_continuations_match_hf(engine):
    prompts = [p["prompt_ids"] for p in HF["prompts"]]
    # HF masked EOS (min_new_tokens=32); min_tokens does the same here.
    outs = engine.generate(prompts, SamplingParams(max_tokens=32, min_tokens=32, temperature=0))
    same = [out.token_ids == p["greedy_ids"] for out, p in zip(outs, HF["prompts"])]
    assert sum(same) >= 19, same


def test_top1_matches_llama_cpp(miro_logits):
    llama_top1 = np.array([p["top1_id"] for p in LLAMA_CPP["prompts"]])
    assert (miro_logits.argmax(axis=1) == llama_top1).sum() >= 18


def test_fast_path_matches_float64_reference(float32_engine, smollm2_path):
    for p in HF["prompts"][:3]:
        expected = reference_logits(smollm2_path, p["prompt_ids"])[-1]
        assert np.abs(float32_engine.logits(p["prompt_ids"]) - expected).max() < 1e-3
