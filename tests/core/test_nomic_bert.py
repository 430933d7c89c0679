"""nomic-bert (nomic-embed-text v1, v1.5): tiny random files in llama.cpp's layout (tests/nomic_bert_factory.py)
against llama.cpp's embeddings of the same bytes (tests/fixtures/nomic_bert_llamacpp.*, made by
scripts/make_nomic_bert_reference.py), mean-pooled and per token, on texts of 3 to 482 tokens, F32, F16 and
Q8_0, and F32 with linear and YaRN RoPE scaling; and what model_check refuses of the layout.

The margin: miro's distance from llama.cpp's base run (flash attention off) is at most MARGIN times llama.cpp's
own spread across its settings, as 1 - the least cosine and as the largest absolute difference. The spread
is flash attention on against off (K and V rounded to float16 on the way in), what llama.cpp itself calls
the same embedding. F32 file: 1 - cosine 3.0e-6, max |diff| 0.0042 pooled; Q8_0: 3.5e-4 and 0.050, where
activations are rounded to 8 bits per block of 32 and a flipped rounding shows. The same vectors without
RoPE fall to a cosine of 0.63 (test_without_rotary_...): a margin five orders of magnitude tighter.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from miro.core import Engine
from miro.core.errors import ModelFileError
from miro.core.kernels import cpu
from miro.core.layers import encoder
from miro.core.loading.model_check import architecture_enum
from miro.core.models import MODELS as SUPPORTED
from miro.core.models.bert import encoder_input
from miro.core.layers.pooling import PoolingParams

FIXTURES = Path(__file__).parents[1] / "fixtures"
sys.path.insert(0, str(Path(__file__).parents[1]))
from nomic_bert_factory import write_tiny_nomic_bert  # noqa: E402

FIX = json.loads((FIXTURES / "nomic_bert_llamacpp.json").read_text())
ARRAYS = np.load(FIXTURES / "nomic_bert_llamacpp.npz")
MODELS = {m["key"]: m for m in FIX["models"]}
TEXTS = FIX["texts"]
MARGIN = 1.5  # times llama.cpp's own spread (see the module's docstring)
RAW = PoolingParams(normalize=False)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def llama_ids(key: str) -> list[list[int]]:
    ids, offsets = ARRAYS[f"{key}/ids"], ARRAYS[f"{key}/offsets"]
    return [ids[offsets[i] : offsets[i + 1]].tolist() for i in range(len(TEXTS))]


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, Path]:
    """The fixture's files, rewritten: the same bytes llama.cpp embedded (sha256 checked)."""
    folder = tmp_path_factory.mktemp("nomic-bert")
    out = {}
    for key, model in MODELS.items():
        out[key] = write_tiny_nomic_bert(folder / f"{key}.gguf", **model["factory_kwargs"])["path"]
        assert hashlib.sha256(out[key].read_bytes()).hexdigest() == model["sha256"], key
    return out


def test_an_input_tokenizes_as_llama_cpp_tokenizes_it(paths):
    engine = Engine.from_model(paths["nomic-bert-F32"], weights="f32")
    assert engine.supported_tasks == ("embed",) and engine.runner is None  # an encoder: no KV cache
    ids = [engine.embedder.make_request("x", text, RAW).token_ids for text in TEXTS]
    assert ids == llama_ids("nomic-bert-F32")
    assert [len(x) for x in ids] == [3, 16, 20, 31, 16, 45, 482]  # up to 482 of the file's 512 positions


@pytest.mark.parametrize(
    "key, weights",
    [
        ("nomic-bert-F32", "f32"),
        ("nomic-bert-F32", "native"),
        ("nomic-bert-F16", "f32"),
        ("nomic-bert-F16", "native"),
        ("nomic-bert-Q8_0", "native"),
        ("nomic-bert-F32-linear2", "f32"),
        ("nomic-bert-F32-yarn4", "f32"),
        ("nomic-bert-F32-yarn4", "native"),
    ],
)
def test_pooled_and_per_token_vectors_are_within_llama_cpps_own_spread(paths, key, weights):
    """native: llama.cpp's arithmetic (Q8_0: activations rounded to 8 bits as its CPU backend rounds them);
    f32 on an F32 or F16 file: the same numbers to float32 rounding (llama.cpp rounds activations to float16
    for F16 weights, within its spread). The scaled files: RoPE's rope.scaling keys (linear 2; YaRN 4 over an
    original context of 128) read as llama.cpp reads them (pooled only: the fixture keeps per-token states
    of the unscaled files)."""
    engine = Engine.from_model(paths[key], weights=weights)
    assert engine.weight_format == weights
    figures = MODELS[key]["figures"]
    pooled = engine.embed(TEXTS, RAW)
    expected = ARRAYS[f"{key}/base/pooled"]
    spread = figures["llama_spread_pooled"]
    assert 1 - cosines(pooled, expected).min() <= MARGIN * (1 - spread["min_pairwise_cosine"])
    assert np.abs(pooled - expected).max() <= MARGIN * spread["max_pairwise_abs_diff"]
    normalized = engine.embed(TEXTS)
    assert np.allclose(normalized, pooled / np.linalg.norm(pooled, axis=1, keepdims=True), atol=1e-6)

    if f"{key}/base/tokens" not in ARRAYS:
        return
    tokens = engine.model.encode(encoder_input(llama_ids(key)))  # every token's final hidden state
    expected = ARRAYS[f"{key}/base/tokens"]
    spread = figures["llama_spread_tokens"]
    assert 1 - cosines(tokens, expected).min() <= MARGIN * (1 - spread["min_pairwise_cosine"])
    assert np.abs(tokens - expected).max() <= MARGIN * spread["max_pairwise_abs_diff"]


def test_f32_weights_on_a_quantized_file_compute_its_dequantized_weights_in_float(paths):
    """llama.cpp rounds activations to 8 bits for Q8_0 weights, f32 weights do not: miro is the float64 pass of
    the file's dequantized weights to float32 rounding, and as far from llama.cpp as that pass is, plus the
    margin."""
    key = "nomic-bert-Q8_0"
    engine = Engine.from_model(paths[key], weights="f32")
    pooled = engine.embed(TEXTS, RAW)
    assert cosines(pooled, ARRAYS[f"{key}/exact/pooled"]).min() >= 0.999999
    figures = MODELS[key]["figures"]
    allowed = (1 - figures["min_cosine_vs_exact_float64"]["base"]) + MARGIN * (
        1 - figures["llama_spread_pooled"]["min_pairwise_cosine"]
    )
    assert 1 - cosines(pooled, ARRAYS[f"{key}/base/pooled"]).min() <= allowed


@pytest.mark.parametrize(
    "weights, least",
    [
        pytest.param("bf16", 0.9995, marks=pytest.mark.skipif(not cpu.HAS_BF16_DOT, reason="needs AVX512_BF16")),
        pytest.param("i16", 0.99995, marks=pytest.mark.skipif(not cpu.HAS_INT16_DOT, reason="needs AVX2")),
    ],
)
def test_the_rounded_weight_formats_stay_near_the_float64_pass(paths, weights, least):
    """bf16 (auto's choice on AVX512_BF16) and i16 round weights and activations: measured 0.99972 (bf16) and
    0.999996 (i16) least cosine to the float64 pass over the three files."""
    for key in MODELS:
        pooled = Engine.from_model(paths[key], weights=weights).embed(TEXTS, RAW)
        assert cosines(pooled, ARRAYS[f"{key}/exact/pooled"]).min() >= least, key


def test_without_rotary_the_vectors_move_far_outside_the_margin(paths, monkeypatch):
    """The test is sensitive: q and k left unrotated (every position alike), the vectors are another model's."""
    key = "nomic-bert-F32"
    engine = Engine.from_model(paths[key], weights="f32")
    expected = ARRAYS[f"{key}/base/pooled"]
    assert cosines(engine.embed(TEXTS, RAW), expected).min() > 0.999999
    monkeypatch.setattr(encoder, "rope_qk", lambda qkv, *args: qkv)
    unrotated = engine.embed(TEXTS, RAW)
    assert cosines(unrotated, expected).min() < 0.7  # measured 0.629; the margin allows 1 - 4.5e-6
    assert np.allclose(cosines(unrotated, ARRAYS[f"{key}/exact_no_rope/pooled"]), 1.0, atol=1e-6)


def test_the_scaling_keys_move_the_vectors_far_outside_the_margin(paths):
    """The scaled files hold the unscaled one's weights: against llama.cpp's vectors of the unscaled file the
    scaled ones fall to a cosine of 0.59 (linear) and 0.54 (YaRN), so reading the keys is what the test sees."""
    expected = ARRAYS["nomic-bert-F32/base/pooled"]
    for key in ("nomic-bert-F32-linear2", "nomic-bert-F32-yarn4"):
        pooled = Engine.from_model(paths[key], weights="f32").embed(TEXTS, RAW)
        assert cosines(pooled, expected).min() < 0.7, key


def test_a_text_embeds_to_the_same_bits_alone_and_packed_with_others(paths):
    engine = Engine.from_model(paths["nomic-bert-Q8_0"], weights="native")
    packed = engine.embed(TEXTS)
    for i in (0, 3, 6):
        assert np.array_equal(engine.embed([TEXTS[i]])[0], packed[i])


def test_miro_run_embeds_openai_and_simple_lines_with_it(paths, tmp_path):
    """`miro run --model file.gguf`: each line's vectors are the engine's, llama.cpp's within the margin."""
    from click.testing import CliRunner

    from miro.cli.main import cli

    key = "nomic-bert-F32"
    lines = [
        {"custom_id": "o", "method": "POST", "url": "/v1/embeddings", "body": {"input": TEXTS[2]}},
        {"id": "s", "input": [TEXTS[1], TEXTS[6]]},
    ]
    dataset = tmp_path / "lines.jsonl"
    dataset.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(
        cli, ["run", str(dataset), "-o", str(out), "--format", "jsonl", "--model", str(paths[key]), "--weights", "f32"]
    )
    assert result.exit_code == 0, result.output
    bodies = {row["custom_id"]: row["response"]["body"] for row in map(json.loads, out.read_text().splitlines())}
    vectors = np.array([bodies["o"]["data"][0]["embedding"]] + [d["embedding"] for d in bodies["s"]["data"]])
    expected = ARRAYS[f"{key}/base/pooled"][[2, 1, 6]]
    assert cosines(vectors, expected).min() >= 1 - MARGIN * (
        1 - MODELS[key]["figures"]["llama_spread_pooled"]["min_pairwise_cosine"]
    )
    assert bodies["s"]["usage"]["prompt_tokens"] == 16 + 482


def test_a_file_without_token_types_embeds_its_tokens_alone(tmp_path):
    """llama.cpp reads token_types as optional: without it nothing is added to the token embeddings."""
    info = write_tiny_nomic_bert(tmp_path / "no-types.gguf", token_types=False)
    assert Engine.from_model(info["path"], weights="f32").embed(TEXTS[:2]).shape == (2, 64)


# -- refused: what miro does not compute as llama.cpp does ----------------------------------------


def refusal(path) -> str:
    with pytest.raises(ModelFileError) as err:
        Engine.from_model(path, weights="f32")
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_every_tensor_kind_of_the_layout_is_read_or_refused_by_name(tmp_path):
    base = write_tiny_nomic_bert(tmp_path / "base.gguf")
    read = {name.rsplit(".", 1)[0] for name in base["tensors"]}
    refused = []
    for kind in gguf.MODEL_TENSORS[architecture_enum("nomic-bert")]:
        stem = gguf.TENSOR_NAMES[kind].format(bid=0)
        if stem in read:
            continue
        shape = (64,) if "NORM" in kind.name else (8, 64)
        extra = {f"{stem}.weight": np.ones(shape)}
        info = write_tiny_nomic_bert(tmp_path / f"{kind.name}.gguf", tensor_overrides=extra)
        assert f"tensor '{stem}.weight'" in refusal(info["path"])
        refused.append(kind.name)
    assert sorted(refused) == ["OUTPUT_NORM", "POS_EMBD"]


@pytest.mark.parametrize(
    "name, shape",
    [
        ("blk.0.ffn_up.bias", (128,)),
        ("blk.1.ffn_down.bias", (64,)),
        ("blk.0.attn_qkv.bias", (192,)),
        ("blk.0.attn_q.weight", (64, 64)),
    ],
)
def test_a_bias_llama_cpp_would_ignore_or_a_layout_miro_does_not_read_is_refused(tmp_path, name, shape):
    """llama.cpp loads ffn_up.bias and ffn_down.bias for nomic-bert and never adds them; nomic's converter
    writes no bias but the LayerNorms'. miro refuses any of them by name rather than guess."""
    info = write_tiny_nomic_bert(tmp_path / "extra.gguf", tensor_overrides={name: np.ones(shape)})
    assert f"tensor '{name}'" in refusal(info["path"])


def test_nomic_bert_moe_is_refused_in_one_sentence(tmp_path):
    info = write_tiny_nomic_bert(tmp_path / "moe.gguf", arch_name="nomic-bert-moe")
    assert refusal(info["path"]).endswith(
        f"architecture 'nomic-bert-moe' is not supported (supported: {', '.join(SUPPORTED)})."
    )


@pytest.mark.parametrize(
    "key, value, what",
    [
        ("nomic-bert.moe_every_n_layers", gguf.GGUFValue(2, gguf.GGUFValueType.UINT32), "metadata key"),
        ("nomic-bert.attention.causal", gguf.GGUFValue(True, gguf.GGUFValueType.BOOL), "encoder only"),
        ("nomic-bert.rope.dimension_count", gguf.GGUFValue(8, gguf.GGUFValueType.UINT32), "partial rotary"),
    ],
)
def test_keys_it_does_not_implement_are_refused(tmp_path, key, value, what):
    info = write_tiny_nomic_bert(tmp_path / "key.gguf", metadata={key: value})
    message = refusal(info["path"])
    assert key.split(".", 1)[1] in message and what in message
