"""The int16 GEMM (layers/int16_gemm.py): its rounding of each operand to 13-bit integers per block of 128, the
product bit for bit against numpy doing the same integer sums and float32 steps, batch invariance, and where
weights='i16' is taken. It runs on every x86 tier (AVX2's vpmaddwd)."""

from __future__ import annotations

import numpy as np
import pytest

from miro.core.errors import MiroError
from miro.core.kernels import cpu
from miro.core.layers import encoder
from miro.core.kernels.int16_gemm import BLOCK, LIMIT, matmul_i16, pack_i16, quantize_rows
from miro.core.loading.weight_format import choose_weight_format

needs_int16 = pytest.mark.skipif(not cpu.HAS_INT16_DOT, reason="the int16 GEMM needs an x86 CPU with AVX2")


def rounded(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a (T, K) -> (integers (T, K') int64, scales (T, n_blocks) float32), K' the blocks' whole length: numpy's
    version of quantize_rows."""
    n, k = a.shape
    n_blocks = -(-k // BLOCK)
    padded = np.zeros((n, n_blocks * BLOCK), np.float32)
    padded[:, :k] = a
    blocks = padded.reshape(n, n_blocks, BLOCK)
    largest = np.abs(blocks).max(axis=2)
    inverse = np.where(largest > 0, np.float32(LIMIT) / np.where(largest > 0, largest, 1), 0).astype(np.float32)
    q = np.rint(blocks * inverse[:, :, None]).astype(np.int64)
    return q.reshape(n, -1), (largest / np.float32(LIMIT)).astype(np.float32)


def words_of(q: np.ndarray) -> np.ndarray:
    return ((q[:, 0::2] & 0xFFFF) | ((q[:, 1::2] & 0xFFFF) << 16)).astype(np.uint32)


@pytest.mark.parametrize("k", [384, 1536, 300, 5])
def test_rows_round_to_13_bit_integers_per_block_of_128(k):
    rng = np.random.default_rng(k)
    a = rng.standard_normal((40, k), dtype=np.float32) * rng.uniform(1e-3, 50, (40, 1)).astype(np.float32)
    a[3] = 0.0  # a zero block: scale 0, integers 0
    a[5, :2] = [1e-30, -2.5]
    n_blocks = -(-k // BLOCK)
    words = np.full((42, n_blocks * BLOCK // 2), 7, np.uint32)
    scales = np.full((42, n_blocks), 7, np.float32)
    quantize_rows(a, words, scales)
    q, s = rounded(a)
    assert np.abs(q).max() == LIMIT
    assert np.array_equal(words[:40], words_of(q)) and np.array_equal(scales[:40], s)
    assert not words[40:].any() and not scales[40:].any()  # the padding rows are zero
    dequantized = (q.reshape(40, n_blocks, BLOCK) * s[:, :, None]).reshape(40, -1)[:, :k]
    assert np.abs(dequantized - a).max() <= np.abs(a).max(axis=1, keepdims=True).max() / LIMIT / 2 * 1.0001


@needs_int16
@pytest.mark.parametrize("rows, k, n", [(1, 384, 384), (7, 385, 40), (6, 128, 16), (37, 1536, 384), (300, 384, 1152)])
def test_the_product_is_numpys_block_by_block_bit_for_bit(rows, k, n):
    rng = np.random.default_rng(rows + k + n)
    a = rng.standard_normal((rows, k), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32) * rng.uniform(0.1, 3, (1, n)).astype(np.float32)
    out = matmul_i16(a, pack_i16(w), np.empty((rows, n), np.float32))
    qa, sa = rounded(a)
    qw, sw = rounded(np.ascontiguousarray(w.T))
    expected = np.zeros((rows, n), np.float32)
    for b in range(sa.shape[1]):
        cols = slice(b * BLOCK, (b + 1) * BLOCK)
        exact = qa[:, cols] @ qw[:, cols].T  # the int32 sums: exact, within 2^31
        assert np.abs(exact).max() < 2**31
        expected = expected + exact.astype(np.float32) * (sw[None, :, b] * sa[:, b, None])
    assert np.array_equal(out, expected)
    reference = a.astype(np.float64) @ w
    assert np.abs(out - reference).max() <= 1e-3 * np.abs(reference).max()


@needs_int16
def test_a_row_gets_the_same_bits_whatever_else_is_in_the_call():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((50, 300), dtype=np.float32)
    packed = pack_i16(rng.standard_normal((300, 70), dtype=np.float32))
    whole = matmul_i16(a, packed, np.empty((50, 70), np.float32))
    for first, last in ((0, 1), (3, 10), (17, 50), (49, 50)):
        part = matmul_i16(a[first:last], packed, np.empty((last - first, 70), np.float32))
        assert np.array_equal(part, whole[first:last])


def test_auto_takes_i16_for_an_encoder_without_bf16_on_x86():
    def auto(**kw):
        return choose_weight_format("auto", 10 << 20, None, None, "avx2", **kw).format

    assert auto(encoder=True, has_bf16=False, has_int16=True) == "i16"
    assert auto(encoder=True, has_bf16=True, has_int16=True) == "bf16"
    assert auto(encoder=True, has_bf16=False, has_int16=False) == "f32"  # portable: no vpmaddwd
    assert auto(encoder=False, has_bf16=False, has_int16=True) == "f32"  # a decoder: native or f32 as before
    with pytest.raises(MiroError, match="weights 'i16' need an x86 CPU with AVX2, and this one runs the portable tier"):
        choose_weight_format("i16", 10 << 20, None, None, "portable", has_int16=False)


@needs_int16
def test_bias_and_residual_are_added_as_numpy_adds_them_after():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((13, 256), dtype=np.float32)
    packed = pack_i16(rng.standard_normal((256, 40), dtype=np.float32))
    bias = rng.standard_normal(40, dtype=np.float32)
    residual = rng.standard_normal((13, 40), dtype=np.float32)
    plain = matmul_i16(a, packed, np.empty((13, 40), np.float32))
    expected = plain + bias
    expected += residual
    fused = matmul_i16(a, packed, np.empty((13, 40), np.float32), bias, residual)
    assert np.array_equal(fused, expected)
    assert np.array_equal(matmul_i16(a, packed, np.empty((13, 40), np.float32), bias), plain + bias)


@needs_int16
@pytest.mark.parametrize("n", [64, 40])  # 40: the last half panel's 8 columns one by one
def test_the_fused_gelu_is_the_encoders_gelu_after_the_product(n):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((20, 384), dtype=np.float32)
    packed = pack_i16(rng.standard_normal((384, n), dtype=np.float32) * np.float32(0.1))
    bias = rng.standard_normal(n, dtype=np.float32)
    residual = rng.standard_normal((20, n), dtype=np.float32)
    expected = encoder.add_bias_gelu(matmul_i16(a, packed, np.empty((20, n), np.float32)), bias)
    assert np.array_equal(matmul_i16(a, packed, np.empty((20, n), np.float32), bias, gelu=True), expected)
    expected += residual
    assert np.array_equal(matmul_i16(a, packed, np.empty((20, n), np.float32), bias, residual, gelu=True), expected)


@needs_int16
def test_a_decoder_runs_with_i16_weights_and_stays_batch_invariant(tmp_path):
    """weights='i16' is a format for any model (auto takes it for encoders only): a tiny llama generates with it,
    a prompt's greedy tokens the same alone and beside others."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from gguf_factory import write_tiny_model

    from miro.core import Engine, SamplingParams

    path = tmp_path / "tiny.gguf"
    write_tiny_model(path)
    engine = Engine.from_model(path, weights="i16")
    assert engine.weight_format == "i16" and engine.model.batch_invariant
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    prompts = [[1, 5, 9, 13], [2, 4, 6], [7, 7, 7, 7, 7]]
    together = [out.outputs[0].token_ids for out in engine.generate(prompts, params, use_tqdm=False)]
    alone = [engine.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    assert together == alone
