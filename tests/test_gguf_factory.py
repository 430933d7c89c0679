"""The test GGUF factory writes what it claims: real files that gguf-py reads back, and broken ones."""

import gguf
import numpy as np
import pytest
from broken_gguf import (
    write_missing_key,
    write_not_gguf,
    write_shape_mismatch,
    write_truncated,
    write_truncated_header,
    write_unsupported_arch,
    write_unsupported_tensor_type,
)
from gguf_factory import SUPPORTED_TYPES, tiny_vocab, write_tiny_llama


def _tensors(path):
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


@pytest.mark.parametrize("ttype", SUPPORTED_TYPES)
def test_tiny_llama_reads_back(tmp_path, ttype):
    path = tmp_path / f"tiny-{ttype}.gguf"
    info = write_tiny_llama(path, tensor_type=ttype, tie_embeddings=False)
    reader = gguf.GGUFReader(path)
    assert reader.fields["general.architecture"].contents() == "llama"
    assert reader.fields["llama.embedding_length"].contents() == info["dim"]
    assert reader.fields["llama.block_count"].contents() == info["n_layers"]
    assert len(reader.fields["tokenizer.ggml.tokens"].contents()) == info["vocab_size"]
    tensors = {t.name: t for t in reader.tensors}
    assert set(tensors) == set(info["tensors"])
    assert tensors["token_embd.weight"].data.shape[0] == info["vocab_size"]
    for name, expected in info["tensors"].items():
        t = tensors[name]
        want_type = "F32" if name.endswith("norm.weight") else ttype
        assert t.tensor_type.name == want_type == info["tensor_types"][name], name
        assert tuple(int(n) for n in t.shape) == expected.shape[::-1], name  # ggml ne = [in, out]
        assert np.isfinite(expected).all() and np.abs(expected).max() < 2.0, name
        # the returned array is exactly what the stored bytes dequantize to
        got = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(expected.shape)
        np.testing.assert_array_equal(got, expected, err_msg=name)


def test_tiny_llama_config_and_options(tmp_path):
    a = write_tiny_llama(tmp_path / "a.gguf", tensor_type="Q8_0", seed=3)
    write_tiny_llama(tmp_path / "b.gguf", tensor_type="Q8_0", seed=3)
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()  # seeded
    assert a["head_dim"] == 16 and "output.weight" not in a["tensors"]
    k = write_tiny_llama(tmp_path / "k.gguf", tensor_type="Q4_K")
    assert (k["dim"], k["ffn_dim"]) == (256, 512)
    r = gguf.GGUFReader(tmp_path / "a.gguf")
    assert r.fields["tokenizer.ggml.model"].contents() == "gpt2"
    assert r.fields["tokenizer.ggml.pre"].contents() == "smollm"
    assert r.fields["tokenizer.ggml.add_bos_token"].contents() is False
    assert "<|im_start|>" in r.fields["tokenizer.chat_template"].contents()
    assert r.fields["llama.rope.freq_base"].contents() == pytest.approx(10000.0)


def test_tiny_vocab_is_consistent():
    tokens, types, merges = tiny_vocab()
    assert tokens[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] and types[:3] == [3, 3, 3]
    assert len(tokens) == 3 + 256 + len(merges) and set(types[3:]) == {1}
    for m in merges:  # every merge joins two known tokens into a known token
        left, right = m.split(" ")
        assert left in tokens and right in tokens and left + right in tokens


def test_not_gguf(tmp_path):
    write_not_gguf(tmp_path / "x.gguf")
    with pytest.raises(ValueError):
        gguf.GGUFReader(tmp_path / "x.gguf")


def test_truncated_in_tensor_data(tmp_path):
    src = tmp_path / "src.gguf"
    write_tiny_llama(src)
    write_truncated(tmp_path / "t.gguf", src)
    size = (tmp_path / "t.gguf").stat().st_size
    r = gguf.GGUFReader(src)
    assert r.data_offset < size < src.stat().st_size
    with pytest.raises(Exception):
        gguf.GGUFReader(tmp_path / "t.gguf")
    write_truncated(tmp_path / "t2.gguf")  # default source
    assert (tmp_path / "t2.gguf").stat().st_size == size


def test_truncated_in_metadata(tmp_path):
    write_truncated_header(tmp_path / "h.gguf")
    with pytest.raises(Exception):
        gguf.GGUFReader(tmp_path / "h.gguf")


def test_unsupported_arch(tmp_path):
    write_unsupported_arch(tmp_path / "m.gguf")
    r = gguf.GGUFReader(tmp_path / "m.gguf")
    assert r.fields["general.architecture"].contents() == "mamba"


def test_unsupported_tensor_type(tmp_path):
    write_unsupported_tensor_type(tmp_path / "q.gguf")
    t = _tensors(tmp_path / "q.gguf")
    assert t["blk.0.attn_q.weight"].tensor_type.name not in SUPPORTED_TYPES
    assert [int(n) for n in t["blk.0.attn_q.weight"].shape] == [256, 256]
    assert {v.tensor_type.name for k, v in t.items() if k != "blk.0.attn_q.weight"} == {"F32"}


def test_missing_key(tmp_path):
    write_missing_key(tmp_path / "k.gguf")
    fields = gguf.GGUFReader(tmp_path / "k.gguf").fields
    assert "llama.embedding_length" not in fields and "llama.block_count" in fields
    with pytest.raises(KeyError):
        write_tiny_llama(tmp_path / "typo.gguf", drop_keys=("llama.no_such_key",))


def test_shape_mismatch(tmp_path):
    write_shape_mismatch(tmp_path / "s.gguf")
    t = _tensors(tmp_path / "s.gguf")
    assert [int(n) for n in t["blk.0.attn_q.weight"].shape] == [64, 48]  # should be [64, 64]
    assert [int(n) for n in t["blk.0.attn_k.weight"].shape] == [64, 32]
