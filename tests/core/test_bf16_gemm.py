"""The bfloat16 GEMM (layers/bf16_gemm.py) against float64 products of the same bfloat16-rounded operands,
and its batch invariance. It needs AVX512_BF16: on other CPUs weights='bf16' is refused in one sentence."""

from __future__ import annotations

import numpy as np
import pytest

from miro.core.errors import MiroError
from miro.core.kernels import cpu
from miro.core.kernels.bf16_gemm import matmul_bf16, pack_bf16, to_bf16_pairs
from miro.core.loading.weight_format import choose_weight_format

needs_bf16 = pytest.mark.skipif(not cpu.HAS_BF16_DOT, reason="this CPU has no AVX512_BF16 (vdpbf16ps)")


def bf16(a: np.ndarray) -> np.ndarray:
    """float32 rounded to bfloat16, nearest with ties to even, as float32."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def test_rounding_to_bfloat16_pairs_is_nearest_even():
    a = np.array([[1.0, 1.00390625, 1.01171875, -2.5, 3.0]], np.float32)  # 1 + 2^-8 ties to 1; 1 + 3 * 2^-8 up
    words = to_bf16_pairs(a, np.empty((1, 3), np.uint32))
    halves = np.stack([words & 0xFFFF, words >> 16], axis=-1).reshape(1, -1)[:, :5].astype(np.uint32) << 16
    assert np.array_equal(halves.view(np.float32), bf16(a))
    assert halves.view(np.float32).tolist() == [[1.0, 1.0, 1.015625, -2.5, 3.0]]


@needs_bf16
@pytest.mark.parametrize("rows, k, n", [(1, 384, 384), (7, 385, 40), (8, 64, 32), (37, 1536, 384), (300, 384, 1152)])
def test_bf16_gemm_is_the_product_of_the_rounded_operands(rows, k, n):
    rng = np.random.default_rng(rows + k + n)
    a = rng.standard_normal((rows, k), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32)
    out = matmul_bf16(a, pack_bf16(w), np.empty((rows, n), np.float32))
    exact = bf16(a).astype(np.float64) @ bf16(w).astype(np.float64)
    assert np.abs(out - exact).max() <= 1e-5 * np.abs(exact).max()


@needs_bf16
def test_a_row_gets_the_same_bits_whatever_else_is_in_the_call():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((50, 300), dtype=np.float32)
    packed = pack_bf16(rng.standard_normal((300, 70), dtype=np.float32))
    whole = matmul_bf16(a, packed, np.empty((50, 70), np.float32))
    for first, last in ((0, 1), (3, 10), (17, 50), (49, 50)):
        part = matmul_bf16(a[first:last], packed, np.empty((last - first, 70), np.float32))
        assert np.array_equal(part, whole[first:last])


def test_auto_takes_bf16_for_an_encoder_only_where_the_cpu_has_it():
    assert (
        choose_weight_format("auto", 10 << 20, None, None, "avx512-vnni", encoder=True, has_bf16=True).format == "bf16"
    )
    assert choose_weight_format("auto", 10 << 20, None, None, "avx2", encoder=True, has_bf16=False).format == "f32"
    assert (
        choose_weight_format("auto", 10 << 20, None, None, "avx512-vnni", encoder=False, has_bf16=True).format == "f32"
    )
    with pytest.raises(MiroError, match="weights 'bf16' need a CPU with AVX512_BF16, and this one runs the avx2 tier"):
        choose_weight_format("bf16", 10 << 20, None, None, "avx2", has_bf16=False)
