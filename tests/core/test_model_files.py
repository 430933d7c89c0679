"""GGUF parsing, dequantization and the forward pass on tiny random models of every supported type."""

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from broken_gguf import (
    write_missing_key,
    write_not_gguf,
    write_shape_mismatch,
    write_truncated,
    write_truncated_header,
    write_unsupported_arch,
    write_unsupported_tensor_type,
)
from gguf_factory import SUPPORTED_TYPES, write_tiny_llama
from reference_model import reference_logits

from miro.cli.main import cli
from miro.core import Engine, ModelFileError, SamplingParams
from miro.core.kernels.dequant import dequantize
from miro.core.loading.gguf_file import GGUFFile


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    return {t: write_tiny_llama(folder / f"tiny-{t}.gguf", tensor_type=t, seed=3) for t in SUPPORTED_TYPES}


def test_parser_matches_gguf_reader(tiny_models, smollm2_path):
    for path in [tiny_models["Q4_1"]["path"], tiny_models["Q6_K"]["path"], smollm2_path]:
        mine = GGUFFile(path)
        reader = gguf.GGUFReader(path)
        scalar_keys = [k for k, f in reader.fields.items() if not k.startswith("GGUF.") and len(f.types) == 1]
        for key in scalar_keys:
            assert mine.metadata[key] == pytest.approx(reader.fields[key].contents()), key
        assert mine.metadata["tokenizer.ggml.tokens"] == reader.fields["tokenizer.ggml.tokens"].contents()
        assert mine.metadata["tokenizer.ggml.merges"] == reader.fields["tokenizer.ggml.merges"].contents()
        assert len(mine.tensors) == len(reader.tensors)
        for t in reader.tensors:
            info = mine.tensors[t.name]
            assert info.type == t.tensor_type
            assert info.shape == tuple(int(n) for n in reversed(t.shape))
            assert np.array_equal(info.data, t.data.reshape(-1).view(np.uint8))


@pytest.mark.parametrize("ttype", SUPPORTED_TYPES)
def test_dequantize_equals_gguf(tiny_models, ttype):
    written = tiny_models[ttype]
    file = GGUFFile(written["path"])
    for name, expected in written["tensors"].items():
        got = dequantize(file.tensors[name])
        assert got.dtype == np.float32
        assert np.array_equal(got, expected), name


def test_dequantize_default_model_fast_paths(smollm2_path):
    file = GGUFFile(smollm2_path)
    for name in ["token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_down.weight"]:
        info = file.tensors[name]
        expected = gguf.quants.dequantize(info.data.reshape(info.shape[0], -1), info.type)
        assert np.array_equal(dequantize(info), expected), name


@pytest.mark.parametrize("ttype", SUPPORTED_TYPES)
@pytest.mark.parametrize("kv_cache_dtype,tolerance", [("float32", 1e-3), ("float16", 5e-3)])
def test_tiny_model_runs_and_matches_float64_reference(tiny_models, ttype, kv_cache_dtype, tolerance):
    """Float32 all through lands within 1e-3 of float64; K and V rounded to float16 within 5e-3."""
    engine = Engine.from_model(
        tiny_models[ttype]["path"], max_model_len=128, num_kv_blocks=32, weights="f32", kv_cache_dtype=kv_cache_dtype
    )
    ids = [5, 40, 77, 3, 120, 9, 64, 200, 31, 18, 7, 99, 150, 12, 60, 33, 270, 1, 44]
    expected = reference_logits(tiny_models[ttype]["path"], ids)[-1]
    got = engine.logits(ids)
    assert np.all(np.isfinite(got))
    print(f"{ttype}, {kv_cache_dtype} KV: max abs diff from float64 {np.abs(got - expected).max():.2e}")
    assert np.abs(got - expected).max() < tolerance
    out = engine.generate([ids], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
    assert len(out.token_ids) == 8 and out.finish_reason == "length"


def test_chunked_prefill_equals_one_pass(tiny_models):
    path = tiny_models["F32"]["path"]
    ids = list(np.random.default_rng(0).integers(3, 270, size=90))
    whole = Engine.from_model(path, max_model_len=128, num_kv_blocks=32).logits(ids)
    chunked = Engine.from_model(path, max_model_len=128, num_kv_blocks=32, max_num_batched_tokens=16).logits(ids)
    assert np.abs(whole - chunked).max() < 1e-5


def test_untied_output_head(tmp_path):
    info = write_tiny_llama(tmp_path / "untied.gguf", tensor_type="Q8_0", tie_embeddings=False)
    ids = [3, 4, 5, 6, 7, 8]
    got = Engine.from_model(info["path"], num_kv_blocks=8, weights="f32", kv_cache_dtype="float32").logits(ids)
    assert np.abs(got - reference_logits(info["path"], ids)[-1]).max() < 1e-3


BAD_FILES = [
    (write_not_gguf, "is not a GGUF file"),
    (write_truncated, "truncated"),
    (write_truncated_header, "truncated"),
    (write_unsupported_arch, "architecture 'mamba' is not supported"),
    (write_unsupported_tensor_type, "type Q2_K, which miro does not support"),
    (write_missing_key, "'llama.embedding_length' is missing"),
    (write_shape_mismatch, "has shape (48, 64), expected (64, 64)"),
]


@pytest.mark.parametrize("writer, message", BAD_FILES, ids=[w.__name__ for w, _ in BAD_FILES])
def test_bad_file_gives_clear_error(tmp_path, writer, message):
    path = tmp_path / "bad.gguf"
    writer(path)
    with pytest.raises(ModelFileError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        Engine.from_model(path)
    assert str(path) in str(err.value)

    result = CliRunner().invoke(cli, ["generate", "--model", str(path), "hello"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: ") and message in result.output
    assert "Traceback" not in result.output and result.output.count("\n") == 1


def test_missing_model_file_is_clear():
    result = CliRunner().invoke(cli, ["generate", "--model", "/no/such/model.gguf", "hello"])
    assert result.exit_code == 1
    assert "neither a known alias" in result.output
