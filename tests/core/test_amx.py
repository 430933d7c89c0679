"""core/kernels/amx.py: B's tile packing, the detection under a target without AMX, and, where AMX runs, the
int8 tile product exactly equal to numpy's on random shapes and thread counts."""

from __future__ import annotations

import os
import subprocess
import sys

import numba
import numpy as np
import pytest

from miro.core.kernels import amx, cpu

needs_amx = pytest.mark.skipif(
    amx.unusable_reason() is not None, reason=f"AMX is not usable here: {amx.unusable_reason()}"
)


def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.astype(np.int32) @ b.astype(np.int32)


def test_b_is_packed_in_contiguous_vnni_tiles_with_zeros_past_its_edges():
    rng = np.random.default_rng(3)
    b = rng.integers(-128, 128, (100, 37), dtype=np.int8)
    packed = amx.pack_b(b)
    assert packed.shape == (3, 2, 16, 64) and packed.flags.c_contiguous
    for j, c, r, n, q in [(0, 0, 0, 0, 0), (1, 1, 2, 5, 3), (2, 0, 15, 4, 2), (0, 1, 8, 15, 3)]:
        assert packed[j, c, r, 4 * n + q] == b[64 * c + 4 * r + q, 16 * j + n]
    assert not packed[2, :, :, 4 * 5 :].any()  # columns 37..47
    assert not packed[:, 1, 9:].any()  # K 100..127


def test_a_target_without_amx_is_refused_in_one_sentence():
    code = "from miro.core.kernels import amx; print(amx.unusable_reason())"
    env = {**os.environ, **cpu.emulation_env("avx2")}
    line = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert line.strip() == "numba does not compile for amx-int8, amx-tile here (the CPU or NUMBA_CPU_FEATURES lacks it)"


@needs_amx
def test_permission_is_granted_where_amx_runs():
    assert amx.request_permission() is True


@needs_amx
@pytest.mark.parametrize(
    "m,k,n",
    [
        (1, 64, 16),
        (1, 576, 576),
        (5, 100, 33),
        (16, 64, 32),
        (17, 192, 48),
        (33, 576, 1536),
        (64, 1536, 80),
        (100, 320, 208),
    ],
)
def test_the_tile_product_is_numpys_exactly(m, k, n):
    rng = np.random.default_rng(m * 1_000_003 + k * 101 + n)
    a = rng.integers(0, 256, (m, k), dtype=np.uint8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    c = amx.gemm(a, amx.pack_b(b), n)
    assert c.shape == (m, n) and c.dtype == np.int32
    np.testing.assert_array_equal(c, reference(a, b))


@needs_amx
def test_extreme_bytes_over_a_long_k_stay_exact():
    k = 8192  # 255 * 128 * 8192 < 2**31
    a = np.full((16, k), 255, np.uint8)
    b = np.full((k, 32), -128, np.int8)
    b[:, 1::2] = 127
    np.testing.assert_array_equal(amx.gemm(a, amx.pack_b(b)), reference(a, b))


@needs_amx
@pytest.mark.parametrize("threads", sorted({1, numba.config.NUMBA_NUM_THREADS}))
def test_every_thread_loads_its_own_tile_configuration(threads):
    """More column tiles than threads, and fewer (a thread with no share loads nothing)."""
    rng = np.random.default_rng(threads)
    previous = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        for n in (16, 48, 400):
            a = rng.integers(0, 256, (40, 128), dtype=np.uint8)
            b = rng.integers(-128, 128, (128, n), dtype=np.int8)
            np.testing.assert_array_equal(amx.gemm(a, amx.pack_b(b)), reference(a, b))
    finally:
        numba.set_num_threads(previous)


@needs_amx
def test_wrong_operands_are_refused():
    b = amx.pack_b(np.zeros((64, 16), np.int8))
    with pytest.raises(ValueError, match="uint8"):
        amx.gemm(np.zeros((2, 64), np.int8), b)
    with pytest.raises(ValueError, match="packed for 64"):
        amx.gemm(np.zeros((2, 128), np.uint8), b)


def blocks32_reference(a, d_a, w, d_w):
    """ggml's Q8_0 float steps in numpy float32: acc + (d_w * d_a) * isum, block after block."""
    acc = np.zeros((a.shape[0], w.shape[0]), np.float32)
    for b in range(a.shape[1] // 32):
        isum = a[:, 32 * b : 32 * b + 32].astype(np.int32) @ w[:, 32 * b : 32 * b + 32].astype(np.int32).T
        acc = acc + (d_w[None, :, b] * d_a[:, b, None]) * isum.astype(np.float32)
    return acc


def test_weight_rows_are_packed_in_32_deep_vnni_tiles():
    w = np.random.default_rng(4).integers(-128, 128, (20, 64), dtype=np.int8)
    packed = amx.pack_w_blocks32(w)
    assert packed.shape == (2, 2, 8, 64)
    for j, b, r, n, q in [(0, 0, 0, 0, 0), (1, 1, 7, 3, 2), (0, 1, 4, 15, 3)]:
        assert packed[j, b, r, 4 * n + q] == w[16 * j + n, 32 * b + 4 * r + q]
    assert not packed[1, :, :, 16:].any()  # rows 20..31


@needs_amx
@pytest.mark.parametrize("m,k,n", [(1, 32, 16), (3, 64, 17), (17, 96, 40), (33, 576, 64), (64, 576, 208)])
def test_the_block_scaled_product_has_ggml_q8_0_bits(m, k, n):
    rng = np.random.default_rng(m * 7919 + k * 31 + n)
    a = rng.integers(-127, 128, (m, k), dtype=np.int8)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    d_a = rng.uniform(1e-3, 1e-2, (m, k // 32)).astype(np.float32)
    d_w = rng.uniform(1e-3, 1e-2, (n, k // 32)).astype(np.float32)
    c = amx.gemm_blocks32(a, d_a, amx.pack_w_blocks32(w), amx.pack_scales_blocks32(d_w), n)
    np.testing.assert_array_equal(c, blocks32_reference(a, d_a, w, d_w))
