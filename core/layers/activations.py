"""Activations quantized to 8 bits per step, as llama.cpp's CPU backend does before a quantized matmul.

Two block formats (ggml-quants.c, quantize_row_q8_0_ref / _q8_1_ref / _q8_K_ref):

- 32-value blocks (Q8_0 / Q8_1), for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 weights:
  d = max|x| / 127, q = roundf(x / d) (half away from zero); d is stored as float16.
  Q8_1 adds s = float16(sum(q) * d), used by the weight types with a minimum (Q4_1, Q5_1).
- 256-value blocks (Q8_K), for the K-quants: iscale = -127 / x[argmax|x|],
  q = min(127, round_half_even(iscale * x)), d = 1 / iscale kept in float32,
  plus the integer sum of each 16 values (bsums), used by the K-quant minimums.

Every row is quantized on its own, so a row's blocks never depend on the other rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from .halfs import round_to_f16

QK = 32  # values per Q8_0 / Q8_1 block
QK_K = 256  # values per Q8_K block


@dataclass
class Q8Blocks:
    """A (T, K) float32 matrix quantized to 32-value blocks (Q8_0, plus Q8_1's sums)."""

    q: np.ndarray  # (T, K) int8
    d: np.ndarray  # (T, K // 32) float32: each block's scale, rounded to float16
    s: np.ndarray  # (T, K // 32) float32: float16(sum(q) * d), Q8_1's extra field
    qsum: np.ndarray  # (T, K // 32) int32: sum(q), exact


@dataclass
class Q8KBlocks:
    """A (T, K) float32 matrix quantized to 256-value Q8_K blocks."""

    q: np.ndarray  # (T, K) int8
    d: np.ndarray  # (T, K // 256) float32
    bsums: np.ndarray  # (T, K // 16) int32: sum of each 16 consecutive q


@njit(inline="always")
def _roundf(v):
    """C's roundf (halves away from zero) of a float32, exactly: the +0.5 is done in float64."""
    return math.copysign(math.floor(abs(np.float64(v)) + 0.5), v)


@njit(cache=True, parallel=True)
def _quantize_q8_32(x, q, d, s, qsum):
    n_rows, k = x.shape
    for t in prange(n_rows):
        for b in range(k // QK):
            k0 = b * QK
            amax = np.float32(0.0)
            for j in range(k0, k0 + QK):
                amax = max(amax, abs(x[t, j]))
            scale = amax / np.float32(127.0)
            inv = np.float32(1.0) / scale if scale != 0 else np.float32(0.0)
            total = 0
            for j in range(k0, k0 + QK):
                v = np.int32(_roundf(x[t, j] * inv))
                q[t, j] = v
                total += v
            d[t, b] = round_to_f16(scale)
            s[t, b] = round_to_f16(np.float32(total) * scale)
            qsum[t, b] = total


@njit(cache=True, parallel=True)
def _quantize_q8_k(x, q, d, bsums):
    magic = np.float32(12582912.0)  # 1.5 * 2^23: adding and subtracting it rounds half to even
    n_rows, k = x.shape
    for t in prange(n_rows):
        for b in range(k // QK_K):
            k0 = b * QK_K
            amax = np.float32(0.0)
            signed_max = np.float32(0.0)
            for j in range(k0, k0 + QK_K):
                ax = abs(x[t, j])
                if ax > amax:
                    amax = ax
                    signed_max = x[t, j]
            if amax == 0:
                d[t, b] = 0
                for j in range(k0, k0 + QK_K):
                    q[t, j] = 0
            else:
                iscale = np.float32(-127.0) / signed_max
                for j in range(k0, k0 + QK_K):
                    v = np.int32((iscale * x[t, j] + magic) - magic)
                    q[t, j] = min(127, v)
                d[t, b] = np.float32(1.0) / iscale
            for g in range(k0 // 16, (k0 + QK_K) // 16):
                total = 0
                for j in range(g * 16, g * 16 + 16):
                    total += q[t, j]
                bsums[t, g] = total


def quantize_q8_32(x: np.ndarray) -> Q8Blocks:
    """Quantize each row of x (T, K), K a multiple of 32, to Q8_0 blocks with Q8_1's sums."""
    n_rows, k = x.shape
    out = Q8Blocks(
        q=np.empty((n_rows, k), np.int8),
        d=np.empty((n_rows, k // QK), np.float32),
        s=np.empty((n_rows, k // QK), np.float32),
        qsum=np.empty((n_rows, k // QK), np.int32),
    )
    _quantize_q8_32(np.ascontiguousarray(x, dtype=np.float32), out.q, out.d, out.s, out.qsum)
    return out


def quantize_q8_k(x: np.ndarray) -> Q8KBlocks:
    """Quantize each row of x (T, K), K a multiple of 256, to Q8_K blocks."""
    n_rows, k = x.shape
    out = Q8KBlocks(
        q=np.empty((n_rows, k), np.int8),
        d=np.empty((n_rows, k // QK_K), np.float32),
        bsums=np.empty((n_rows, k // 16), np.int32),
    )
    _quantize_q8_k(np.ascontiguousarray(x, dtype=np.float32), out.q, out.d, out.bsums)
    return out
