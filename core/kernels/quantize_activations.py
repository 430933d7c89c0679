"""Activations quantized to 8 bits per step, as llama.cpp's CPU backend does before a quantized matmul.

Two block formats (ggml-quants.c, quantize_row_q8_0_ref / _q8_1_ref / _q8_K_ref):

- 32-value blocks (Q8_0 / Q8_1), for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 weights:
  d = max|x| / 127, q = roundf(x / d) (half away from zero); d is stored as float16.
  Q8_1 adds s = float16(sum(q) * d), used by the weight types with a minimum (Q4_1, Q5_1).
- 256-value blocks (Q8_K), for the K-quants: iscale = -127 / x[argmax|x|],
  q = min(127, round_half_even(iscale * x)), d = 1 / iscale kept in float32,
  plus the integer sum of each 16 values (bsums), used by the K-quant minimums.

Every row is quantized on its own, so a row's blocks never depend on the other rows.

Layouts: row-major (T, K) for the row-by-row kernels, and for the tile kernels (K-quants' with each
256 values in "quad order", superblock_tiles.py); for the kernels that vectorise over
activation rows ("lanes", the portable tier), transposed: "columns" (K, lanes) int8, their per-block
fields as (blocks, lanes). Lanes past T are zero.
"""

from __future__ import annotations

import math
import types
from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from miro.core.kernels.cache_key import HELPERS
from miro.core.kernels.halfs import round_to_f16
from miro.core.kernels.superblock_tiles import store_in_quad_order

QK = 32  # values per Q8_0 / Q8_1 block
QK_K = 256  # values per Q8_K block
ROWS_PER_TASK = 16  # activation rows quantized together into the lanes layout (64-byte stores)
CHUNK_BLOCKS = 16  # 32-value blocks of those rows a task quantizes: a few rows still keep every core busy
# Lets LLVM vectorise the max|x| loops (a max with NaN is not associative). No reassociation,
# no contraction: the numbers stay ggml's for every finite input.
_NO_NANS = {"nnan", "nsz"}


@dataclass
class Q8Blocks:
    """A (T, K) float32 matrix quantized to 32-value blocks (Q8_0, plus Q8_1's sums)."""

    q: np.ndarray  # (T, K) int8, or the lanes layout (uint8)
    d: np.ndarray  # (T, K // 32) float32: each block's scale, rounded to float16; or (K // 32, lanes)
    s: np.ndarray  # same shape: float16(sum(q) * d), Q8_1's extra field
    qsum: np.ndarray  # same shape, int32: sum(q), exact


@dataclass
class Q8KBlocks:
    """A (T, K) float32 matrix quantized to 256-value Q8_K blocks."""

    q: np.ndarray  # (T, K) int8, or the lanes layout (uint8)
    d: np.ndarray  # (T, K // 256) float32, or (K // 256, lanes)
    sum32: np.ndarray  # (T, K // 32) int32: sum of each 32 consecutive q (ggml's bsums two by two), or (K // 32, lanes)


# ---------------------------------------------------------------- one row


@njit(inline="always")
def _roundf(v):
    """C's roundf (halves away from zero) of a float32, in float32: v - trunc(v) is exact."""
    whole = np.float32(math.trunc(v))
    away = abs(v - whole) >= np.float32(0.5)
    return np.int32(whole + (np.float32(math.copysign(1.0, v)) if away else np.float32(0.0)))


@njit(inline="always")
def _quantize_row_q8_32(x_row, q_row, d, s, qsum, qk):
    """One row of K values to Q8_0 blocks: q_row (K,) int8 and, per block b, d[b], s[b], qsum[b].

    `qk` is 32, passed at run time so that LLVM vectorises the loops over a block's values.
    """
    for b in range(x_row.shape[0] // qk):
        k0 = b * qk
        amax = np.float32(0.0)
        for k in range(k0, k0 + qk):
            amax = max(amax, abs(x_row[k]))
        scale = amax / np.float32(127.0)
        inv = np.float32(1.0) / scale if scale != 0 else np.float32(0.0)
        total = np.int32(0)
        for k in range(k0, k0 + qk):
            v = _roundf(x_row[k] * inv)
            q_row[k] = v
            total += v
        d[b] = round_to_f16(scale)
        s[b] = round_to_f16(np.float32(total) * scale)
        qsum[b] = total


@njit(inline="always")
def _first_largest_magnitude(x_row, k0, n):
    """The first of x_row[k0:k0 + n] whose magnitude is the largest, as ggml picks it (0 if all are 0).

    The largest and smallest values are vector reductions; only when +m and -m both occur does a scalar scan
    say which comes first."""
    high = np.float32(0.0)
    low = np.float32(0.0)
    for k in range(k0, k0 + n):
        high = max(high, x_row[k])
        low = min(low, x_row[k])
    if high != -low:
        return high if high > -low else low
    for k in range(k0, k0 + n):
        if abs(x_row[k]) == high:
            return x_row[k]
    return np.float32(0.0)


@njit(inline="always")
def _quantize_row_q8_k(x_row, q_row, d, sum32, qk, rounded):
    """One row of K values to Q8_K blocks: q_row (K,) int8, d[b] per 256 values, sum32[g] per 32; rounded: a
    float32 scratch of 256.

    `qk` is 32, passed at run time so that LLVM vectorises the loops over a block's values.
    """
    magic = np.float32(12582912.0)  # 1.5 * 2^23: adding and subtracting it rounds half to even
    for b in range(x_row.shape[0] // QK_K):
        k0 = b * QK_K
        signed_max = _first_largest_magnitude(x_row, k0, 8 * qk)
        amax = abs(signed_max)
        iscale = np.float32(-127.0) / signed_max if amax != 0 else np.float32(0.0)
        d[b] = np.float32(1.0) / iscale if amax != 0 else np.float32(0.0)
        # in float32 first, then stored: a loop that reads x_row and writes q_row LLVM leaves scalar (10x slower)
        for k in range(8 * qk):
            rounded[k] = min(np.float32(127.0), (iscale * x_row[k0 + k] + magic) - magic)
        for k in range(8 * qk):
            q_row[k0 + k] = np.int8(rounded[k])
        for g in range(8):
            total = np.int32(0)
            for k in range(g * qk, g * qk + qk):
                total += np.int32(rounded[k])
            sum32[k0 // qk + g] = total


# ---------------------------------------------------------------- the lanes layouts


@njit(inline="always")
def _store_columns(rows_q, q, t0, k0=0):
    """Rows' int8 values (rows, values k0..) into columns t0.. of q (K, lanes)."""
    for k in range(rows_q.shape[1]):
        for r in range(rows_q.shape[0]):
            q[k0 + k, t0 + r] = rows_q[r, k]


# ---------------------------------------------------------------- the kernels


def _build_kernels():
    """The cached quantizers, made here so that they close over HELPERS (see cache_key.py)."""
    helpers = HELPERS

    def rows_q8_32(x, q, d, s, qsum, qk):
        helpers  # in numba's cache key
        for t in prange(x.shape[0]):
            _quantize_row_q8_32(x[t], q[t], d[t], s[t], qsum[t], qk)

    @njit(cache=True, parallel=True, fastmath=_NO_NANS)
    def rows_q8_k(x, q, d, sum32, qk):
        helpers  # in numba's cache key
        for t in prange(x.shape[0]):
            _quantize_row_q8_k(x[t], q[t], d[t], sum32[t], qk, np.empty(QK_K, np.float32))

    def rows_q8_k_quads(x, q, d, sum32, qk):
        """Each row quantized into a scratch, then stored in quad order (see quantize_q8_k_quads)."""
        helpers  # in numba's cache key
        for t in prange(x.shape[0]):
            row = np.empty(x.shape[1], np.int8)
            _quantize_row_q8_k(x[t], row, d[t], sum32[t], qk, np.empty(QK_K, np.float32))
            q_t = q[t]
            for k0 in range(0, x.shape[1], QK_K):
                store_in_quad_order(row, k0, q_t, k0)

    @njit(cache=True, parallel=True, fastmath=_NO_NANS)
    def lanes_q8_32(x, q, d, s, qsum, qk):
        """ROWS_PER_TASK rows and CHUNK_BLOCKS blocks at a time (so that a few rows still use every core):
        quantized row by row into a scratch, then stored transposed."""
        helpers  # in numba's cache key
        n_rows, k = x.shape
        chunk = CHUNK_BLOCKS * qk
        n_chunks = (k + chunk - 1) // chunk
        for task in prange((n_rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK * n_chunks):
            group, k0 = task // n_chunks, task % n_chunks * chunk
            t0, k1 = group * ROWS_PER_TASK, min(k, k0 + chunk)
            b0, b1 = k0 // qk, k1 // qk
            rows_q = np.empty((min(ROWS_PER_TASK, n_rows - t0), k1 - k0), np.int8)
            for r in range(rows_q.shape[0]):
                _quantize_row_q8_32(
                    x[t0 + r, k0:k1], rows_q[r], d[b0:b1, t0 + r], s[b0:b1, t0 + r], qsum[b0:b1, t0 + r], qk
                )
            _store_columns(rows_q, q, t0, k0)

    @njit(cache=True, parallel=True, fastmath=_NO_NANS)
    def lanes_q8_k(x, q, d, sum32, qk):
        helpers  # in numba's cache key
        n_rows, k = x.shape
        for task in prange((n_rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
            t0 = task * ROWS_PER_TASK
            rows_q = np.empty((min(ROWS_PER_TASK, n_rows - t0), k), np.int8)
            rounded = np.empty(QK_K, np.float32)
            for r in range(rows_q.shape[0]):
                _quantize_row_q8_k(x[t0 + r], rows_q[r], d[:, t0 + r], sum32[:, t0 + r], qk, rounded)
            _store_columns(rows_q, q, t0)

    return (_both(rows_q8_32), rows_q8_k, _both(rows_q8_k_quads), lanes_q8_32, lanes_q8_k)


def _both(function):
    """(parallel, serial) compilations of one row quantizer: one row alone is quantized on the calling thread, which
    saves waking the thread pool (about 4 us, a tenth of a 2048 x 2048 product at one row); the same code per row."""
    serial = types.FunctionType(
        function.__code__,
        function.__globals__,
        function.__name__ + "_serial",
        function.__defaults__,
        function.__closure__,
    )
    serial.__qualname__ = function.__qualname__ + "_serial"  # its own entry in numba's cache
    return (njit(cache=True, parallel=True, fastmath=_NO_NANS)(function), njit(cache=True, fastmath=_NO_NANS)(serial))


_rows_q8_32_both, _rows_q8_k, _rows_q8_k_quads_both, _lanes_q8_32, _lanes_q8_k = _build_kernels()


def _rows_q8_32(x, *args):
    _rows_q8_32_both[x.shape[0] == 1](x, *args)


def _rows_q8_k_quads(x, *args):
    _rows_q8_k_quads_both[x.shape[0] == 1](x, *args)


# ---------------------------------------------------------------- the quantizers


def _float32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32)


def quantize_q8_32(x: np.ndarray, n_rows: int | None = None) -> Q8Blocks:
    """Quantize each row of x (T, K), K a multiple of 32, to Q8_0 blocks with Q8_1's sums; n_rows >= T
    rows in all, those past T zero."""
    t, k = x.shape
    n_rows = t if n_rows is None else n_rows
    new = np.empty if n_rows == t else np.zeros
    out = Q8Blocks(
        q=new((n_rows, k), np.int8),
        d=new((n_rows, k // QK), np.float32),
        s=new((n_rows, k // QK), np.float32),
        qsum=new((n_rows, k // QK), np.int32),
    )
    _rows_q8_32(_float32(x), out.q[:t], out.d[:t], out.s[:t], out.qsum[:t], QK)
    return out


def quantize_q8_k(x: np.ndarray) -> Q8KBlocks:
    """Quantize each row of x (T, K), K a multiple of 256, to Q8_K blocks."""
    n_rows, k = x.shape
    out = Q8KBlocks(
        q=np.empty((n_rows, k), np.int8),
        d=np.empty((n_rows, k // QK_K), np.float32),
        sum32=np.empty((n_rows, k // QK), np.int32),
    )
    _rows_q8_k(_float32(x), out.q, out.d, out.sum32, QK)
    return out


def quantize_q8_k_quads(x: np.ndarray, n_rows: int | None = None) -> Q8KBlocks:
    """x (T, K) to Q8_K blocks for the K-quant tile kernel: q (n_rows, K) int8 with each 256 values in
    quad order, value quad_value(Q, l, i) at 32 Q + 4 l + i (superblock_tiles.py: 4 values of ggml lane l side
    by side); d, sum32 as quantize_q8_k's. n_rows >= T rows in all, those past T zero."""
    t, k = x.shape
    n_rows = t if n_rows is None else n_rows
    out = Q8KBlocks(
        q=np.empty((n_rows, k), np.int8),
        d=np.empty((n_rows, k // QK_K), np.float32),
        sum32=np.empty((n_rows, k // QK), np.int32),
    )
    for part in (out.q, out.d, out.sum32):
        part[t:] = 0
    _rows_q8_k_quads(_float32(x), out.q[:t], out.d[:t], out.sum32[:t], QK)
    return out


def _q8_32_lanes(x: np.ndarray, n_lanes: int, q: np.ndarray) -> Q8Blocks:
    blocks = x.shape[1] // QK
    out = Q8Blocks(
        q=q,
        d=np.zeros((blocks, n_lanes), np.float32),
        s=np.zeros((blocks, n_lanes), np.float32),
        qsum=np.zeros((blocks, n_lanes), np.int32),
    )
    _lanes_q8_32(_float32(x), out.q, out.d, out.s, out.qsum, QK)
    return out


def _q8_k_lanes(x: np.ndarray, n_lanes: int, q: np.ndarray) -> Q8KBlocks:
    k = x.shape[1]
    out = Q8KBlocks(q=q, d=np.zeros((k // QK_K, n_lanes), np.float32), sum32=np.zeros((k // QK, n_lanes), np.int32))
    _lanes_q8_k(_float32(x), out.q, out.d, out.sum32, QK)
    return out


def quantize_q8_32_columns(x: np.ndarray, n_lanes: int) -> Q8Blocks:
    """x (T, K) to 32-value blocks, transposed: q (K, n_lanes) int8, d, s, qsum (K / 32, n_lanes)."""
    return _q8_32_lanes(x, n_lanes, np.zeros((x.shape[1], n_lanes), np.int8))


def quantize_q8_k_columns(x: np.ndarray, n_lanes: int) -> Q8KBlocks:
    """x (T, K) to Q8_K blocks, transposed: q (K, n_lanes) int8, d (K / 256, n_lanes), sum32 (K / 32, n_lanes)."""
    return _q8_k_lanes(x, n_lanes, np.zeros((x.shape[1], n_lanes), np.int8))
