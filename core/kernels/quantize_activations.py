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

from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from miro.core.kernels.cache_key import HELPERS
from miro.core.kernels.halfs import round_to_f16
from miro.core.kernels.simd import abs16, load16
from miro.core.kernels.simd_narrowing import (
    hlargest,
    hsmallest,
    hsum_int,
    larger16,
    round_away16,
    smaller16,
    store16_int8,
    to_int,
)
from miro.core.kernels.superblock_tiles import store_in_quad_order

QK = 32  # values per Q8_0 / Q8_1 block
QK_K = 256  # values per Q8_K block
ROWS_PER_TASK = 16  # activation rows quantized together into the lanes layout (64-byte stores)
CHUNK_BLOCKS = 16  # 32-value blocks of those rows a task quantizes: a few rows still keep every core busy
# Values (T x K) from which the row quantizers split the rows over the thread pool. Called back to back with the
# pool awake, 2 threads beat 1 from about 32K values (benchmarks/quantizers.py); inside an engine step on a
# machine with other work, a parallel call waits 0.1-1 ms for the other core (default model, native weights, 2
# cores: B=64 decode, quantizers 84 ms a step split from 32K values against 2.4 ms serial, the step's least 286
# against 211 ms; 512-token prefill, up to 786K values a call: 100 against 17 ms). From 256K values (~50 us on
# one core) a split saves more than it costs on a machine the engine has to itself: 2 cores, quiet, engines in
# turn, 1M -> 256K: the default model's 48 ShareGPT prompts 1,142 -> 1,163 tok/s (medians of 3; 128K and 64K
# slower than 256K in each round), moe.py's AVX2 batch 13.19 -> 12.91 s (medians of 4). With one busy process
# beside it, both thresholds ran the default model at ~1/5 of its speed (211-225 tok/s): every kernel's split
# waits then, the row kernels' are not what decides it.
PARALLEL_FROM = 1 << 18
_MINUS_127, _PLUS_127 = np.float32(-127.0), np.float32(127.0)


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
def _quantize_row_q8_32(x_row, q_row, d, s, qsum):
    """One row of K values to Q8_0 blocks: q_row (K,) int8 and, per block b, d[b], s[b], qsum[b]; every array
    contiguous.

    In passes over the row, each a loop whose blocks do not wait on one another (a block's steps done one after the
    other form a chain of dependent instructions longer than the core can overlap): each block's max|x| (two 16-lane
    vectors, one horizontal max) into d; 1 / d into s, a loop LLVM vectorises (divisions 16 at a time); the
    quotients, rounded, and their sum; the float16 d and s. The values are clamped to +-127 before rounding, which
    changes no finite block (|x| / d <= 127 up to rounding) and keeps q defined where 1 / d overflows (max|x| <
    3.7e-37; d is 0 there)."""
    n_blocks = x_row.shape[0] // QK
    for b in range(n_blocks):
        k0 = b * QK
        d[b] = max(np.float32(0.0), hlargest(larger16(abs16(load16(x_row, k0)), abs16(load16(x_row, k0 + 16)))))
    for b in range(n_blocks):
        scale = d[b] / np.float32(127.0)
        s[b] = np.float32(1.0) / scale if scale != 0 else np.float32(0.0)
    for b in range(n_blocks):
        k0, inv = b * QK, s[b]
        q_low = round_away16(smaller16(larger16(load16(x_row, k0) * inv, _MINUS_127), _PLUS_127))
        q_high = round_away16(smaller16(larger16(load16(x_row, k0 + 16) * inv, _MINUS_127), _PLUS_127))
        store16_int8(q_row, k0, q_low)
        store16_int8(q_row, k0 + 16, q_high)
        qsum[b] = hsum_int(q_low + q_high)
    for b in range(n_blocks):
        scale = d[b] / np.float32(127.0)
        d[b] = round_to_f16(scale)
        s[b] = round_to_f16(np.float32(qsum[b]) * scale)


@njit(inline="always")
def _first_largest_magnitude(x_row, k0):
    """The first of x_row[k0:k0 + 256] whose magnitude is the largest, as ggml picks it (0 if all are 0).

    The largest and smallest values are vector reductions (two of each, to halve their chains); only when +m and
    -m both occur does a scalar scan say which comes first."""
    high_a = load16(x_row, k0)
    high_b = load16(x_row, k0 + 16)
    low_a, low_b = high_a, high_b
    for k in range(k0 + 32, k0 + QK_K, 32):
        a = load16(x_row, k)
        b = load16(x_row, k + 16)
        high_a, high_b = larger16(high_a, a), larger16(high_b, b)
        low_a, low_b = smaller16(low_a, a), smaller16(low_b, b)
    top = max(np.float32(0.0), hlargest(larger16(high_a, high_b)))
    bottom = min(np.float32(0.0), hsmallest(smaller16(low_a, low_b)))
    if top != -bottom:
        return top if top > -bottom else bottom
    for k in range(k0, k0 + QK_K):
        if abs(x_row[k]) == top:
            return x_row[k]
    return np.float32(0.0)


@njit(inline="always")
def _round_q8_k(v, iscale):
    """min(127, round_half_even(iscale * v)) lane by lane, as int32x16: 1.5 * 2^23 added and subtracted rounds."""
    magic = np.float32(12582912.0)
    return to_int(smaller16(larger16((v * iscale + magic) - magic, _MINUS_127), _PLUS_127))


@njit(inline="always")
def _quantize_row_q8_k(x_row, q_row, d, sum32, quads):
    """One row of K values to Q8_K blocks: q_row (K,) int8, d[b] per 256 values, sum32[g] per 32. x_row and q_row
    contiguous; d, sum32 any stride. quads (a constant): q_row's values in the K-quant tiles' quad order
    (quantize_q8_k_quads), else in row order.

    In passes, as _quantize_row_q8_32: each block's iscale = -127 / (its first largest magnitude, signed) into d;
    then q = min(127, round_half_even(iscale * x)) by the magic constant, 16 lanes at a time, and d = 1 / iscale.
    The clamp to -127 changes no finite value (iscale * x >= -127 up to rounding) and keeps q defined where iscale
    overflows (a block whose largest magnitude is below 3.7e-37)."""
    n_blocks = x_row.shape[0] // QK_K
    for b in range(n_blocks):
        signed_max = _first_largest_magnitude(x_row, b * QK_K)
        d[b] = np.float32(-127.0) / signed_max if signed_max != 0 else np.float32(0.0)
    for b in range(n_blocks):
        iscale = d[b]
        for k in range(b * QK_K, (b + 1) * QK_K, QK):
            q_low = _round_q8_k(load16(x_row, k), iscale)
            q_high = _round_q8_k(load16(x_row, k + 16), iscale)
            store16_int8(q_row, k, q_low)
            store16_int8(q_row, k + 16, q_high)
            sum32[k // QK] = hsum_int(q_low + q_high)
        d[b] = np.float32(1.0) / iscale if iscale != 0 else np.float32(0.0)
    if quads:  # once the whole row is stored (bytes reloaded just after their store stall), in place: each
        for b in range(n_blocks):  # 64 bytes are loaded before their two quads are stored
            store_in_quad_order(q_row, b * QK_K, q_row, b * QK_K)


# ---------------------------------------------------------------- the lanes layouts


@njit(inline="always")
def _store_columns(rows_q, q, t0, k0=0):
    """Rows' int8 values (rows, values k0..) into columns t0.. of q (K, lanes)."""
    for k in range(rows_q.shape[1]):
        for r in range(rows_q.shape[0]):
            q[k0 + k, t0 + r] = rows_q[r, k]


@njit(inline="always")
def rows_to_q8_32(x):
    """x (T, K) float32 to new Q8_0 arrays with Q8_1's sums (q, d, s, qsum), on the calling thread: for a tile
    kernel given a lone row as floats (tile_kernels.tiles_32), one compiled call rather than two."""
    t, k = x.shape
    q, d, s, qsum = (
        np.empty((t, k), np.int8),
        np.empty((t, k // QK), np.float32),
        np.empty((t, k // QK), np.float32),
        np.empty((t, k // QK), np.int32),
    )
    for row in range(t):
        _quantize_row_q8_32(x[row], q[row], d[row], s[row], qsum[row])
    return q, d, s, qsum


@njit(inline="always")
def rows_to_q8_k(x, quads):
    """x (T, K) float32 to new Q8_K arrays (q, d, sum32), on the calling thread, as rows_to_q8_32 for the K-quant
    tile kernel (superblock_kernels.tiles_k). quads: a constant, as _quantize_row_q8_k's."""
    t, k = x.shape
    q, d, sum32 = np.empty((t, k), np.int8), np.empty((t, k // QK_K), np.float32), np.empty((t, k // QK), np.int32)
    for row in range(t):
        _quantize_row_q8_k(x[row], q[row], d[row], sum32[row], quads)
    return q, d, sum32


# ---------------------------------------------------------------- the kernels


def _build_kernels():
    """The cached quantizers, made here so that they close over HELPERS (see cache_key.py)."""
    helpers = HELPERS

    @njit(cache=True, parallel=True)
    def rows_q8_32(x, q, d, s, qsum, parallel):
        """parallel: the rows split over the thread pool, else quantized on the calling thread (one compilation
        for both, so that a call of either compiles the other too)."""
        helpers  # in numba's cache key
        if parallel:
            for t in prange(x.shape[0]):
                _quantize_row_q8_32(x[t], q[t], d[t], s[t], qsum[t])
        else:
            for t in range(x.shape[0]):
                _quantize_row_q8_32(x[t], q[t], d[t], s[t], qsum[t])

    @njit(cache=True, parallel=True)
    def rows_q8_k(x, q, d, sum32, parallel):
        helpers  # in numba's cache key
        if parallel:
            for t in prange(x.shape[0]):
                _quantize_row_q8_k(x[t], q[t], d[t], sum32[t], False)
        else:
            for t in range(x.shape[0]):
                _quantize_row_q8_k(x[t], q[t], d[t], sum32[t], False)

    @njit(cache=True, parallel=True)
    def rows_q8_k_quads(x, q, d, sum32, parallel):
        """As rows_q8_k, each super-block's values in quad order (see quantize_q8_k_quads)."""
        helpers  # in numba's cache key
        if parallel:
            for t in prange(x.shape[0]):
                _quantize_row_q8_k(x[t], q[t], d[t], sum32[t], True)
        else:
            for t in range(x.shape[0]):
                _quantize_row_q8_k(x[t], q[t], d[t], sum32[t], True)

    @njit(cache=True, parallel=True)
    def lanes_q8_32(x, q, d, s, qsum):
        """ROWS_PER_TASK rows and CHUNK_BLOCKS blocks at a time (so that a few rows still use every core):
        quantized row by row into a scratch, then stored transposed."""
        helpers  # in numba's cache key
        n_rows, k = x.shape
        chunk = CHUNK_BLOCKS * QK
        n_chunks = (k + chunk - 1) // chunk
        for task in prange((n_rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK * n_chunks):
            group, k0 = task // n_chunks, task % n_chunks * chunk
            t0, k1 = group * ROWS_PER_TASK, min(k, k0 + chunk)
            b0, b1 = k0 // QK, k1 // QK
            rows_q = np.empty((min(ROWS_PER_TASK, n_rows - t0), k1 - k0), np.int8)
            fields = np.empty((3, b1 - b0), np.float32)  # one row's d, s and qsum (as int32), contiguous
            sums = fields[2].view(np.int32)
            for r in range(rows_q.shape[0]):
                _quantize_row_q8_32(x[t0 + r, k0:k1], rows_q[r], fields[0], fields[1], sums)
                d[b0:b1, t0 + r] = fields[0]
                s[b0:b1, t0 + r] = fields[1]
                qsum[b0:b1, t0 + r] = sums
            _store_columns(rows_q, q, t0, k0)

    @njit(cache=True, parallel=True)
    def lanes_q8_k(x, q, d, sum32):
        helpers  # in numba's cache key
        n_rows, k = x.shape
        for task in prange((n_rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
            t0 = task * ROWS_PER_TASK
            rows_q = np.empty((min(ROWS_PER_TASK, n_rows - t0), k), np.int8)
            for r in range(rows_q.shape[0]):
                _quantize_row_q8_k(x[t0 + r], rows_q[r], d[:, t0 + r], sum32[:, t0 + r], False)
            _store_columns(rows_q, q, t0)

    return rows_q8_32, rows_q8_k, rows_q8_k_quads, lanes_q8_32, lanes_q8_k


_rows_q8_32, _rows_q8_k, _rows_q8_k_quads, _lanes_q8_32, _lanes_q8_k = _build_kernels()


def _parallel(x: np.ndarray) -> bool:
    """Whether a row quantizer splits x's rows over the thread pool: from PARALLEL_FROM values."""
    return x.shape[0] > 1 and x.size >= PARALLEL_FROM


# ---------------------------------------------------------------- the quantizers
# (each output array passed whole where it can be: a view costs about as much as quantizing a short row)


def _float32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32)


def quantize_q8_32(x: np.ndarray, n_rows: int | None = None) -> Q8Blocks:
    """Quantize each row of x (T, K), K a multiple of 32, to Q8_0 blocks with Q8_1's sums; n_rows >= T
    rows in all, those past T zero."""
    t, k = x.shape
    n_rows = t if n_rows is None else n_rows
    new = np.empty if n_rows == t else np.zeros
    blocks = (n_rows, k // QK)
    q, d, s, qsum = new((n_rows, k), np.int8), new(blocks, np.float32), new(blocks, np.float32), new(blocks, np.int32)
    if n_rows == t:
        _rows_q8_32(_float32(x), q, d, s, qsum, _parallel(x))
    else:
        _rows_q8_32(_float32(x), q[:t], d[:t], s[:t], qsum[:t], _parallel(x))
    return Q8Blocks(q, d, s, qsum)


def quantize_q8_k(x: np.ndarray) -> Q8KBlocks:
    """Quantize each row of x (T, K), K a multiple of 256, to Q8_K blocks."""
    t, k = x.shape
    q, d, sum32 = np.empty((t, k), np.int8), np.empty((t, k // QK_K), np.float32), np.empty((t, k // QK), np.int32)
    _rows_q8_k(_float32(x), q, d, sum32, _parallel(x))
    return Q8KBlocks(q, d, sum32)


def quantize_q8_k_quads(x: np.ndarray, n_rows: int | None = None) -> Q8KBlocks:
    """x (T, K) to Q8_K blocks for the K-quant tile kernel: q (n_rows, K) int8 with each 256 values in
    quad order, value quad_value(Q, l, i) at 32 Q + 4 l + i (superblock_tiles.py: 4 values of ggml lane l side
    by side); d, sum32 as quantize_q8_k's. n_rows >= T rows in all, those past T zero."""
    t, k = x.shape
    n_rows = t if n_rows is None else n_rows
    new = np.empty if n_rows == t else np.zeros
    q, d, sum32 = new((n_rows, k), np.int8), new((n_rows, k // QK_K), np.float32), new((n_rows, k // QK), np.int32)
    if n_rows == t:
        _rows_q8_k_quads(_float32(x), q, d, sum32, _parallel(x))
    else:
        _rows_q8_k_quads(_float32(x), q[:t], d[:t], sum32[:t], _parallel(x))
    return Q8KBlocks(q, d, sum32)


def _q8_32_lanes(x: np.ndarray, n_lanes: int, q: np.ndarray) -> Q8Blocks:
    blocks = x.shape[1] // QK
    out = Q8Blocks(
        q=q,
        d=np.zeros((blocks, n_lanes), np.float32),
        s=np.zeros((blocks, n_lanes), np.float32),
        qsum=np.zeros((blocks, n_lanes), np.int32),
    )
    _lanes_q8_32(_float32(x), out.q, out.d, out.s, out.qsum)
    return out


def _q8_k_lanes(x: np.ndarray, n_lanes: int, q: np.ndarray) -> Q8KBlocks:
    k = x.shape[1]
    out = Q8KBlocks(q=q, d=np.zeros((k // QK_K, n_lanes), np.float32), sum32=np.zeros((k // QK, n_lanes), np.int32))
    _lanes_q8_k(_float32(x), out.q, out.d, out.sum32)
    return out


def quantize_q8_32_columns(x: np.ndarray, n_lanes: int) -> Q8Blocks:
    """x (T, K) to 32-value blocks, transposed: q (K, n_lanes) int8, d, s, qsum (K / 32, n_lanes)."""
    return _q8_32_lanes(x, n_lanes, np.zeros((x.shape[1], n_lanes), np.int8))


def quantize_q8_k_columns(x: np.ndarray, n_lanes: int) -> Q8KBlocks:
    """x (T, K) to Q8_K blocks, transposed: q (K, n_lanes) int8, d (K / 256, n_lanes), sum32 (K / 32, n_lanes)."""
    return _q8_k_lanes(x, n_lanes, np.zeros((x.shape[1], n_lanes), np.int8))
