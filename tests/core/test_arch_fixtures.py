"""The llama.cpp oracle fixtures for the llama, qwen2, qwen3 and gemma3 architectures hold together.

tests/fixtures/arch_llamacpp.{json,npz} come from scripts/make_arch_reference.py
(tiny random models written by gguf_factory.write_tiny_model, run by llama.cpp)
and tests/fixtures/gemma3_llamacpp.json from scripts/make_gemma3_reference.py
(the real gemma3-270m). These tests need no llama.cpp: they check that the
factory still writes the very files llama.cpp ran, and that the recorded
logits and greedy tokens agree with each other. Tests of miro's own forward
pass against them live with the architectures' implementation.
"""

import hashlib
import json
import re

import gguf
import numpy as np
import pytest
from fixture_files import FIXTURES
from gguf_factory import tensor_name, write_tiny_model

ARCH = json.loads((FIXTURES / "arch_llamacpp.json").read_text())
ARCH_LOGITS = np.load(FIXTURES / "arch_llamacpp.npz")
MODELS = {m["key"]: m for m in ARCH["models"]}
GEMMA3 = json.loads((FIXTURES / "gemma3_llamacpp.json").read_text(encoding="utf-8"))
TYPES = ("Q8_0", "Q4_0", "Q4_K")
# The factory's first four layouts; smollm3, granite, olmo2 and mistral3 came later, with their own llama.cpp
# reference (tests/fixtures/dense_llamacpp.*, tests/core/test_dense_reach.py).
ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")
MT = gguf.MODEL_TENSOR


def test_arch_fixture_covers_every_architecture_and_type():
    assert sorted((m["arch"], m["tensor_type"]) for m in ARCH["models"]) == sorted(
        (a, t) for a in ARCHITECTURES for t in TYPES
    )
    assert ARCH["skipped"] == {}
    lengths = [len(p) for p in ARCH["prompts"]]
    assert min(lengths) == 3 and max(lengths) == 40
    assert all(3 <= t < 272 for p in ARCH["prompts"] for t in p)  # no control tokens
    window = MODELS["gemma3-Q8_0"]["config"]["sliding_window"]
    assert sum(n > window for n in lengths) == 3  # the window matters for three of the four prompts
    assert set(ARCH_LOGITS.files) == {f"{k}/p{i}" for k in MODELS for i in range(len(ARCH["prompts"]))}
    assert ARCH["settings"]["type_k"] == "f32" and ARCH["settings"]["flash_attn"] is False


def test_gemma3_tiny_models_have_local_and_global_layers():
    for ttype in TYPES:
        config = MODELS[f"gemma3-{ttype}"]["config"]
        assert config["n_layers"] == 7 and config["local_layers"] == [0, 1, 2, 3, 4, 6]  # layer 5 is global
        assert config["rope_theta"] == 1e6 and config["rope_theta_local"] == 1e4
        assert config["head_dim"] * config["n_heads"] != config["dim"]  # key_length is not dim / n_heads


@pytest.mark.parametrize("key", sorted(MODELS))
def test_factory_writes_the_file_llamacpp_ran(tmp_path, key):
    model = MODELS[key]
    info = write_tiny_model(tmp_path / f"{key}.gguf", **model["factory_kwargs"])
    data = info["path"].read_bytes()
    assert len(data) == model["file_size"]
    assert hashlib.sha256(data).hexdigest() == model["sha256"]
    assert info["tensor_types"] == model["tensor_types"]
    assert {k: info[k] for k in model["config"] if k in info} == {k: v for k, v in model["config"].items() if k in info}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_tiny_model_layout_is_llamacpps(tmp_path, arch):
    info = write_tiny_model(tmp_path / "m.gguf", arch=arch, tensor_type="Q8_0")
    reader = gguf.GGUFReader(info["path"])
    fields, tensors = reader.fields, {t.name: t for t in reader.tensors}
    assert fields[gguf.Keys.General.ARCHITECTURE].contents() == arch
    assert fields[gguf.Keys.LLM.EMBEDDING_LENGTH.format(arch=arch)].contents() == info["dim"]
    has_key_length = gguf.Keys.Attention.KEY_LENGTH.format(arch=arch) in fields
    assert has_key_length == (arch in ("qwen3", "gemma3"))
    if has_key_length:
        assert fields[gguf.Keys.Attention.KEY_LENGTH.format(arch=arch)].contents() == info["head_dim"]
        assert fields[gguf.Keys.Attention.VALUE_LENGTH.format(arch=arch)].contents() == info["head_dim"]
    assert (gguf.Keys.Attention.SLIDING_WINDOW.format(arch=arch) in fields) == (arch == "gemma3")
    # every tensor is one gguf-py knows for the architecture
    known = {gguf.TENSOR_NAMES[k] for k in gguf.MODEL_TENSORS[gguf.MODEL_ARCH[arch.upper()]]}
    for name in tensors:
        assert re.sub(r"^blk\.\d+\.", "blk.{bid}.", name.rsplit(".", 1)[0]) in known, name
    q = tensors[tensor_name(MT.ATTN_Q, 0)]
    assert tuple(int(n) for n in q.shape) == (info["dim"], info["n_heads"] * info["head_dim"])  # ggml ne = [in, out]
    assert (tensor_name(MT.ATTN_Q, 0, "bias") in tensors) == (arch == "qwen2")
    assert (tensor_name(MT.ATTN_Q_NORM, 0) in tensors) == (arch in ("qwen3", "gemma3"))
    assert (tensor_name(MT.FFN_POST_NORM, 0) in tensors) == (arch == "gemma3")
    for name, t in tensors.items():
        if name.endswith(("norm.weight", ".bias")):
            assert t.tensor_type.name == "F32", name


@pytest.mark.parametrize("key", sorted(MODELS))
def test_llamacpp_logits_are_finite_and_greedy_is_their_argmax(key):
    model = MODELS[key]
    for run in model["runs"]:
        prompt = ARCH["prompts"][run["prompt_index"]]
        logits = ARCH_LOGITS[f"{key}/p{run['prompt_index']}"]
        assert logits.dtype == np.float32
        assert logits.shape == (len(prompt) + ARCH["n_new_tokens"] - 1, model["config"]["vocab_size"])
        assert np.isfinite(logits).all() and logits.std() > 0.1
        assert len(run["greedy_ids"]) == ARCH["n_new_tokens"]
        steps = logits[len(prompt) - 1 :]  # row n_prompt - 1 + k predicts greedy_ids[k]
        assert steps.argmax(axis=1).tolist() == run["greedy_ids"]
        top2 = np.sort(steps, axis=1)[:, -2:]
        np.testing.assert_allclose(top2[:, 1] - top2[:, 0], run["greedy_margins"], atol=1e-5)
        assert 0 <= run["greedy_stable_prefix"] <= ARCH["n_new_tokens"]
        # an exact float64 pass of the documented conventions lands close to llama.cpp
        assert run["max_abs_diff_vs_exact_float64"] < 0.3
        if len(prompt) > 1:
            assert not np.allclose(logits[0], logits[len(prompt) - 1], atol=0.05)  # context matters


def test_gemma3_fixture_prompts_come_from_the_other_fixtures():
    chats = json.loads((FIXTURES / "chat_prompts.json").read_text(encoding="utf-8"))
    corpus = json.loads((FIXTURES / "tokenizer_corpus.json").read_text(encoding="utf-8"))
    assert len(GEMMA3["prompts"]) == 40
    for p in GEMMA3["prompts"]:
        name, index = p["source"].rstrip("]").split("[")
        if name == "chat_prompts.json":
            user = [m["content"] for m in chats[int(index)]["messages"] if m["role"] == "user"][-1]
            assert p["text"] == f"Question: {user}\nAnswer:"
        else:
            assert name == "tokenizer_corpus.json" and p["text"] == corpus[int(index)]


def test_gemma3_fixture_is_consistent():
    assert GEMMA3["bos_id"] == 2 and GEMMA3["eos_id"] == 1 and 1 in GEMMA3["eog_ids"]
    assert GEMMA3["top_k"] == 5 and GEMMA3["n_new_tokens"] == 32
    for p in GEMMA3["prompts"]:
        assert p["ids"][0] == GEMMA3["bos_id"] and GEMMA3["bos_id"] not in p["ids"][1:]
        assert len(p["top5_ids"]) == len(set(p["top5_ids"])) == 5
        assert all(np.isfinite(p["top5_logits"]))
        assert p["top5_logits"] == sorted(p["top5_logits"], reverse=True)
        assert len(p["greedy_ids"]) == len(p["greedy_margins"]) == 32
        assert p["greedy_ids"][0] == p["top5_ids"][0]
        assert p["greedy_margins"][0] == pytest.approx(p["top5_logits"][0] - p["top5_logits"][1], abs=1e-4)
        assert min(p["greedy_margins"]) >= 0
        eog = [k for k, t in enumerate(p["greedy_ids"]) if t in GEMMA3["eog_ids"]]
        assert p["first_eog_index"] == (eog[0] if eog else None)
    assert sum(len(p["ids"]) > 100 for p in GEMMA3["prompts"]) >= 2  # some long prompts too


def test_gemma3_fixture_is_for_the_registry_model():
    from miro.core.loading.registry import ALIASES

    source = ALIASES["gemma3-270m"]
    assert GEMMA3["model"] == source.filename
    assert GEMMA3["model_sha256"] == source.sha256
