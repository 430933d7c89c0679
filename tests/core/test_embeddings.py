"""Embeddings in the engine: the real all-MiniLM-L6-v2 against sentence-transformers' and llama.cpp's outputs
(tests/fixtures/minilm_reference.*, scripts/make_embedding_reference.py), pooling and its options, packing,
bad inputs, and a decoder with last-token pooling against llama.cpp (scripts/make_qwen3_embedding_reference.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from miro.core import Engine
from miro.core.loading.convert import gguf_tensor_name, phantom_vocabulary
from miro.core.errors import ModelFileError, RequestError
from miro.core.kernels import cpu
from miro.core.layers.pooling import PoolingParams

FIXTURES = Path(__file__).parents[1] / "fixtures"
sys.path.insert(0, str(Path(__file__).parents[1]))
from gguf_factory import write_tiny_model  # noqa: E402

TEXTS = json.loads((FIXTURES / "embedding_corpus.json").read_text())
REFERENCE = np.load(FIXTURES / "minilm_reference.npz")
FACTS = json.loads((FIXTURES / "minilm_reference.json").read_text())
# llama.cpp's WPM tokenizer and BERT's own (HF's tokenizer.json) part on these: Hangul split into jamo by HF's
# normaliser, a word over 100 characters ([UNK] in HF), "[CLS]" written in the text (a special token to HF)
IDS_DIFFER = {entry["index"] for entry in FACTS["llama_ids_differ"]}


def ragged(name: str, i: int) -> list[int]:
    offsets = REFERENCE[f"{name}_offsets"]
    return REFERENCE[f"{name}_ids"][offsets[i] : offsets[i + 1]].tolist()


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def minilm(minilm_path) -> Engine:
    """The defaults: bf16 weights where the CPU has AVX512_BF16, else i16 on x86, else f32. (Every test of the real
    model takes minilm_path, directly or through these fixtures: it pulls the file, and marks the test `model`.)"""
    return Engine.from_model("all-minilm-l6-v2")


@pytest.fixture(scope="module")
def minilm_f32(minilm_path) -> Engine:
    return Engine.from_model("all-minilm-l6-v2", weights="f32")


@pytest.fixture(scope="module")
def vectors(minilm) -> np.ndarray:
    return minilm.embed(TEXTS)


def test_the_corpus_is_what_the_fixture_was_made_from():
    assert len(TEXTS) == FACTS["n_texts"] == len(REFERENCE["st_embeddings"])


def test_every_text_is_within_1e_4_of_sentence_transformers(minilm, vectors):
    cos = cosines(vectors, REFERENCE["st_embeddings"])
    assert cos.min() >= 0.9999, (minilm.weight_format, cos.argmin(), cos.min())
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    assert minilm.weight_format == ("bf16" if cpu.HAS_BF16_DOT else "i16" if cpu.HAS_INT16_DOT else "f32")


@pytest.mark.skipif(not cpu.HAS_INT16_DOT, reason="the int16 GEMM needs an x86 CPU with AVX2")
def test_i16_weights_stay_closer_to_sentence_transformers_than_bf16(minilm_path):
    """13-bit integers per block of 128 (weights and activations): what auto takes on x86 without AVX512_BF16."""
    engine = Engine.from_model("all-minilm-l6-v2", weights="i16")
    assert engine.weight_format == "i16"
    cos = cosines(engine.embed(TEXTS), REFERENCE["st_embeddings"])
    assert cos.min() >= 0.99999, (cos.argmin(), cos.min())  # bf16: 0.99997


def test_f32_weights_give_sentence_transformers_vectors_to_float32_rounding(minilm_f32):
    cos = cosines(minilm_f32.embed(TEXTS), REFERENCE["st_embeddings"])
    assert cos.min() >= 0.999999


def test_token_ids_are_bert_tokenizers_and_llama_cpps_where_those_agree(minilm):
    for i, text in enumerate(TEXTS):
        ids = minilm.embedder.make_request("x", text, PoolingParams()).token_ids
        assert ids == ragged("hf", i), i
        if i not in IDS_DIFFER:
            assert ids == ragged("llama", i), i
    assert IDS_DIFFER == {66, 81, 84}  # what the fixture's llama.cpp gave: if it changes, look again


def test_embeddings_are_within_1e_3_of_llama_cpp_on_the_same_file(vectors):
    agree = [i for i in range(len(TEXTS)) if i not in IDS_DIFFER]
    cos = cosines(vectors[agree], REFERENCE["llama_embeddings"][agree])
    assert cos.min() >= 0.999


def test_mean_and_cls_pooling_without_normalising_give_sentence_transformers_vectors(minilm_f32):
    picks = [0, 31, 61, 79]
    texts = [TEXTS[i] for i in picks]
    mean = minilm_f32.embed(texts, PoolingParams(normalize=False))
    assert np.allclose(mean, REFERENCE["st_unnormalized"][picks], atol=2e-5)
    cls = minilm_f32.embed(texts, PoolingParams(pooling_type="cls", normalize=False))
    assert np.allclose(cls, REFERENCE["st_cls"][picks], atol=2e-5)
    assert cosines(cls, mean).max() < 0.999  # really another vector


def test_dimensions_cut_the_vector_then_normalise_it(minilm):
    full = minilm.embed(TEXTS[:3], PoolingParams(normalize=False))
    cut = minilm.embed(TEXTS[:3], PoolingParams(dimensions=64))
    assert cut.shape == (3, 64)
    expected = full[:, :64] / np.linalg.norm(full[:, :64], axis=1, keepdims=True)
    assert np.allclose(cut, expected, atol=1e-6)
    with pytest.raises(RequestError, match="dimensions is 385, but the model's embeddings have 384"):
        minilm.embed(TEXTS[:1], PoolingParams(dimensions=385))


@pytest.mark.parametrize(
    "weights",
    [
        "auto",
        "f32",
        pytest.param(
            "i16", marks=pytest.mark.skipif(not cpu.HAS_INT16_DOT, reason="the int16 GEMM needs an x86 CPU with AVX2")
        ),
    ],
)
def test_a_text_embeds_to_the_same_bits_alone_and_packed_with_others(minilm_path, weights):
    engine = Engine.from_model("all-minilm-l6-v2", weights=weights)
    packed = engine.embed(TEXTS[:24])
    for i in (0, 9, 20):
        assert np.array_equal(engine.embed([TEXTS[i]])[0], packed[i])
    small = Engine.from_model("all-minilm-l6-v2", weights=weights, embed_batch_tokens=64)  # many small passes
    assert np.array_equal(small.embed(TEXTS[:12]), packed[:12])


def test_token_ids_are_embedded_as_given(minilm, vectors):
    ids = ragged("hf", 5)
    assert np.allclose(minilm.embed([ids])[0], vectors[5], atol=1e-6)


def test_an_input_longer_than_the_context_is_refused_unless_truncation_is_asked(minilm):
    long_text = "word " * 600
    with pytest.raises(
        RequestError,
        match=r"input 1: the input has 602 tokens, more than the model's context of "
        r"512: shorten it, or set truncate_prompt_tokens \(--truncate\)",
    ):
        minilm.embed(["short", long_text])
    cut = minilm.embedder.make_request("x", long_text, PoolingParams(truncate_prompt_tokens=8)).token_ids
    assert cut == [101] + [2773] * 6 + [102]  # [CLS], the first words, [SEP]
    whole = minilm.embedder.make_request("y", long_text, PoolingParams(truncate_prompt_tokens=-1)).token_ids
    assert len(whole) == 512 and whole[-1] == 102
    assert minilm.embed([long_text], PoolingParams(truncate_prompt_tokens=-1)).shape == (1, 384)


@pytest.mark.parametrize(
    "bad, message",
    [
        ("", "the input is an empty string"),
        ([], "the input is an empty list of token ids"),
        ([5, 30522], "token ids outside the vocabulary"),
    ],
)
def test_inputs_it_cannot_embed_are_one_sentence_each(minilm, bad, message):
    [out] = minilm.encode([bad])
    assert out.embedding is None and message in out.error


def test_pooling_options_are_checked():
    with pytest.raises(RequestError, match="pooling_type must be one of mean, cls, last"):
        PoolingParams(pooling_type="max")
    with pytest.raises(RequestError, match="truncate_prompt_tokens must be a positive integer or -1"):
        PoolingParams(truncate_prompt_tokens=0)


def test_an_embedding_model_refuses_to_generate_and_a_chat_model_to_embed(minilm, tiny_model):
    with pytest.raises(RequestError, match="is an embedding model: it embeds text"):
        minilm.add_request("hello")
    chat = Engine.from_model(tiny_model)
    assert chat.supported_tasks == ("generate",) and minilm.supported_tasks == ("embed",)
    assert minilm.refusal("embed") is None and chat.refusal("generate") is None
    assert "cannot embed" in chat.refusal("embed") and "is an embedding model" in minilm.refusal("generate")
    with pytest.raises(RequestError, match="cannot embed: it generates text"):
        chat.embed(["hello"])


def test_an_aborted_embedding_comes_back_once_without_a_vector(minilm):
    minilm.add_request("to be aborted", PoolingParams(), request_id="gone")
    assert minilm.abort("gone")
    [out] = minilm.step()
    assert out.request_id == "gone" and out.embedding is None and out.error == "aborted"
    assert not minilm.has_unfinished_requests()


def test_passes_take_the_most_urgent_waiting_inputs_first_and_skip_aborted_ones(minilm, monkeypatch):
    monkeypatch.setattr(minilm.embedder, "batch_tokens", 1)  # one input a pass: the passes show the order
    for request_id, priority in [("n1", 0), ("low", 1), ("n2", 0), ("gone", -1), ("high", -1), ("n3", 0)]:
        minilm.add_request(f"text {request_id}", PoolingParams(), request_id=request_id, priority=priority)
    assert minilm.abort("gone")
    order = []
    while minilm.has_unfinished_requests():
        order += [out.request_id for out in minilm.step()]
    assert order == ["gone", "high", "n1", "n2", "n3", "low"]  # an abort answers at once, in the next step


def test_an_encoder_holds_no_kv_cache(minilm):
    assert minilm.kv_cache_tokens == 0 and minilm.runner is None


def test_hf_tensor_names_map_to_llama_cpps_bert_layout():
    assert gguf_tensor_name("encoder.layer.3.output.dense.bias") == "blk.3.ffn_down.bias"
    assert gguf_tensor_name("encoder.layer.0.attention.self.query.weight") == "blk.0.attn_q.weight"
    assert gguf_tensor_name("bert.embeddings.LayerNorm.gamma") == "token_embd_norm.weight"
    assert gguf_tensor_name("embeddings.position_ids") is None and gguf_tensor_name("pooler.dense.weight") is None
    with pytest.raises(ModelFileError, match="is not part of a BERT encoder"):
        gguf_tensor_name("encoder.layer.0.crossattention.self.query.weight")


def test_the_vocabulary_takes_llama_cpps_phantom_space_form():
    tokens, types = phantom_vocabulary({"[CLS]": 0, "hello": 1, "##lo": 2}, {"[CLS]"})
    assert tokens == ["[CLS]", "\u2581hello", "lo"] and types == [3, 1, 1]


# -- a decoder with last-token pooling (Qwen3-Embedding's shape) against llama.cpp ---------------------

QWEN3 = json.loads((FIXTURES / "qwen3_last_pooling_llamacpp.json").read_text())
QWEN3_OUTPUTS = np.load(FIXTURES / "qwen3_last_pooling_llamacpp.npz")


@pytest.mark.parametrize("model", QWEN3["models"], ids=lambda m: m["key"])
def test_a_qwen3_file_with_last_pooling_embeds_as_llama_cpp_does(tmp_path, model):
    path = tmp_path / "qwen3-embed.gguf"
    write_tiny_model(path, **model["factory_kwargs"])
    engine = Engine.from_model(path, weights="native", kv_cache_memory="16MiB")
    assert engine.supported_tasks == ("embed",)
    raw = engine.embed(QWEN3["prompts"], PoolingParams(normalize=False))
    expected = QWEN3_OUTPUTS[f"{model['key']}/raw"]
    spread = model["figures"]["min_pairwise_cosine_all_settings"]  # llama.cpp's own, across its settings
    assert cosines(raw, expected).min() >= spread
    assert np.allclose(np.linalg.norm(raw, axis=1), np.linalg.norm(expected, axis=1), rtol=1e-3)
    normalized = engine.embed(QWEN3["prompts"])
    assert cosines(normalized, QWEN3_OUTPUTS[f"{model['key']}/normalized"]).min() >= spread
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks  # the pass's blocks freed
