"""An int16 GEMM for AVX2 CPUs, which have no bfloat16 dot: twice float32's multiply rate on Zen, exact integer sums.

    out (T, N) = a (T, K) @ W (K, N), each operand rounded to 13-bit integers per block of 128 values of k

vpmaddwd multiplies 16 pairs of int16 by 16 pairs and adds each pair's two products into an int32 lane: per
instruction twice the products of a float32 FMA (with a vpaddd to accumulate them). On 2 Zen 5 cores under the
AVX2 emulation it runs 1.6x the float32 GEMM (benchmarks/encoder_gemm.py --tier avx2). The
weights are rounded once at load (`pack_i16`): per column and block of 128 k, a float32 scale
d = max|w| / 4095 and integers q = rint(w / d) in -4095..4095. The activations are rounded the same way on each
call, per row and block. Within a block a product of integers is at most 4095^2 and a lane sums 128 of them:
below 2^31, so the int32 sums are exact. Each block's sum then enters a float32 sum per element:

    out[t, n] = sum over blocks b, in order, of float32(isum[t, n, b]) * (d_w[n, b] * d_a[t, b])

12 bits and a sign per 128 values keep more of the operands than bfloat16's 8-bit mantissa
(all-MiniLM-L6-v2's vectors, tests/core/test_embeddings.py). Every element is the same chain whatever the row
count and wherever the row sits: batch invariant.

The tile is the float32 GEMM's 256-bit one (gemm.py): 6 rows x 16 columns, the int32 sums in 12 ymm, one step of
a k-pair two weight loads and 6 broadcast words (8 rows spill AVX2's 16 registers: half the speed). Weights are packed in 16-column half panels, two k to a 32-bit
word: half panel h's k-pair j, column c at w[(h * K2 + j) * 16 + c], the even k in the low half. Rows past the
last full tile run zero-padded through the same tile.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.core.extending import intrinsic

from miro.core.kernels.cache_key import HELPERS
from miro.core.layers.encoder import gelu1, gelu16
from miro.core.kernels.f32_gemm import row_blocks
from miro.core.kernels.simd import (
    LANES,
    abs16,
    float32x16,
    hmax,
    int32x16,
    int_zeros16,
    load16,
    max16,
    splat,
    store16,
    to_float,
    zeros16,
)

BLOCK = 128  # values of k per scale: 128 products of at most 4095^2 stay below 2^31
PAIRS = BLOCK // 2  # k-pairs (32-bit words) per block
LIMIT = 4095  # the largest integer magnitude
ROWS = 6  # activation rows per tile
ROW_BLOCK_BYTES = 128 * 1024  # activation words per block of rows, to stay in L2 (64-128 KiB measured 2-5% over 256)

_V8 = ir.VectorType(ir.IntType(32), 8)
_V16_WORDS = ir.VectorType(ir.IntType(16), 16)


@intrinsic
def madd_pairs(typingctx, acc, pair, weights):
    """acc + (the two int16 of `pair` against each column's two int16 in `weights`, products summed): two
    256-bit vpmaddwd and a vpaddd per half."""

    def codegen(context, builder, sig, args):
        acc_v, pair_v, weights_v = args
        broadcast = builder.bitcast(splat(builder, pair_v, _V8), _V16_WORDS)
        madd = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_V8, [_V16_WORDS, _V16_WORDS]), "llvm.x86.avx2.pmadd.wd"
        )
        halves = []
        for lanes in (range(8), range(8, 16)):
            half = builder.shuffle_vector(weights_v, weights_v, ir.Constant(_V8, list(lanes)))
            halves.append(builder.call(madd, [builder.bitcast(half, _V16_WORDS), broadcast]))
        products = builder.shuffle_vector(
            halves[0], halves[1], ir.Constant(ir.VectorType(ir.IntType(32), LANES), list(range(LANES)))
        )
        return builder.add(acc_v, products)

    return int32x16(int32x16, types.uint32, int32x16), codegen


@intrinsic
def store_pairs(typingctx, words, index, value):
    """words[index:index + 8] = value's 16 lanes rounded to the nearest integer (ties to even, as np.rint),
    as int16, two to a word (lane 2i low): vroundps, vcvttps2dq and a pack."""

    def codegen(context, builder, sig, args):
        words_v, index_v, value_v = args
        vf = ir.VectorType(ir.FloatType(), LANES)
        rint = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf]), "llvm.rint.v16f32")
        integers = builder.fptosi(builder.call(rint, [value_v]), ir.VectorType(ir.IntType(32), LANES))
        pairs = builder.bitcast(builder.trunc(integers, ir.VectorType(ir.IntType(16), LANES)), _V8)
        data = context.make_array(sig.args[0])(context, builder, words_v).data
        builder.store(pairs, builder.bitcast(builder.gep(data, [index_v]), _V8.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.void(words, types.intp, float32x16), codegen


@njit(cache=True, parallel=True)
def quantize_rows(a, words, scales):
    """a (T, K) float32 -> words (T', K2) uint32, two int16 of a row's k-pair each (k even low), and scales
    (T', n_blocks) float32, per row and block of 128 k; rows and k past a's zero. A whole block takes 16
    values at a time, the same operations as the scalar loop's."""
    n, k_dim = a.shape
    for t in prange(words.shape[0]):
        for b in range(scales.shape[1]):
            k0, k1 = b * BLOCK, min(k_dim, (b + 1) * BLOCK)
            if t < n and k1 - k0 == BLOCK:
                row = a[t]
                biggest = abs16(load16(row, k0))
                for i in range(k0 + LANES, k1, LANES):
                    biggest = max16(biggest, abs16(load16(row, i)))
                largest = hmax(biggest)
                scales[t, b] = largest / np.float32(LIMIT)
                inverse = np.float32(LIMIT) / largest if largest > 0 else np.float32(0.0)
                for i in range(k0, k1, LANES):
                    store_pairs(words[t], i // 2, load16(row, i) * inverse)
                continue
            largest = np.float32(0.0)
            if t < n:
                for i in range(k0, k1):
                    largest = max(largest, abs(a[t, i]))
            scales[t, b] = largest / np.float32(LIMIT)
            inverse = np.float32(LIMIT) / largest if largest > 0 else np.float32(0.0)
            for j in range(b * PAIRS, (b + 1) * PAIRS):
                word = np.uint32(0)
                for h in range(2):
                    i = 2 * j + h
                    if t < n and i < k1:
                        q = np.int32(np.rint(a[t, i] * inverse))
                        q = max(-LIMIT, min(LIMIT, q))
                        word |= np.uint32(q & 0xFFFF) << np.uint32(16 * h)
                words[t, j] = word
    return words, scales


def blocks_of(k_dim: int) -> int:
    return -(-k_dim // BLOCK)


def pack_i16(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(K, N) float32 -> (the half panels of k-pairs as uint32 (ceil(N / 16), K2, 16), their scales
    (ceil(N / 16), n_blocks, 16) float32), K2 = n_blocks * 64; padding zero."""
    k_dim, n_cols = w.shape
    n_blocks, n_halves = blocks_of(k_dim), -(-n_cols // LANES)
    words = np.empty((n_halves * LANES, n_blocks * PAIRS), np.uint32)  # a column's words, as a row of a.T
    scales = np.empty((n_halves * LANES, n_blocks), np.float32)
    columns = np.zeros((n_halves * LANES, k_dim), np.float32)
    columns[:n_cols] = w.T
    quantize_rows(columns, words, scales)
    packed = np.ascontiguousarray(words.reshape(n_halves, LANES, -1).transpose(0, 2, 1))
    return packed, np.ascontiguousarray(scales.reshape(n_halves, LANES, n_blocks).transpose(0, 2, 1))


_NO_BIAS, _NO_RESIDUAL = np.zeros(0, np.float32), np.zeros((0, 0), np.float32)


def matmul_i16(
    a: np.ndarray,
    w: tuple[np.ndarray, np.ndarray],
    out: np.ndarray,
    bias: np.ndarray | None = None,
    residual: np.ndarray | None = None,
    gelu: bool = False,
) -> np.ndarray:
    """out (T, N) = a (T, K) @ W with W packed by pack_i16, then + bias (N,), then GELU (gelu=True), then
    + residual (T, N) where given: done as each tile is stored, the same float32 operations as
    `out += bias; encoder.add_bias_gelu(out, 0); out += residual` after, without their passes over memory."""
    words, scales = w
    n_rows = -(-a.shape[0] // ROWS) * ROWS
    a_words = np.empty((n_rows, words.shape[1]), np.uint32)
    a_scales = np.empty((n_rows, scales.shape[1]), np.float32)
    quantize_rows(a, a_words, a_scales)
    return _matmul(
        a_words,
        a_scales,
        words.reshape(-1),
        scales.reshape(-1),
        out,
        _NO_BIAS if bias is None else bias,
        _NO_RESIDUAL if residual is None else residual,
        gelu,
    )


def _build():
    helpers = HELPERS

    @njit(cache=True, parallel=True)
    def matmul(a, a_scales, w, w_scales, out, bias, residual, gelu):
        """out (T, N) = the rounded a (T6, K2 words) @ the half panels w (flat), T6 >= T a multiple of 6, + bias
        (N,) unless empty, GELU'd when `gelu`, + residual (T, N) unless empty. Work items are (block of rows,
        half panel), as in gemm.py's 256-bit GEMM."""
        helpers  # in numba's cache key: see cache_key.py
        n_rows, k2_dim = a.shape
        n_blocks = a_scales.shape[1]
        n_out, n_cols = out.shape
        n_halves = (n_cols + LANES - 1) // LANES
        block_rows, n_row_blocks = row_blocks(n_rows, k2_dim * 4, ROWS, ROW_BLOCK_BYTES)
        for item in prange(n_row_blocks * n_halves):
            r0 = item // n_halves * block_rows
            r1 = min(n_rows, r0 + block_rows)
            h = item % n_halves
            n0 = h * LANES
            width = min(LANES, n_cols - n0)
            sums = np.empty((block_rows, LANES), np.float32)
            for b in range(n_blocks):
                d_w = load16(w_scales, (h * n_blocks + b) * LANES)
                start = (h * k2_dim + b * PAIRS) * LANES
                for m0 in range(r0, r1, ROWS):
                    _tile(a, a_scales, w, start, d_w, m0, b, sums[m0 - r0 : m0 - r0 + ROWS])
            if width == LANES:
                for m in range(r0, min(r1, n_out)):
                    value = load16(sums[m - r0], 0)
                    if len(bias):
                        value = value + load16(bias, n0)
                    if gelu:
                        value = gelu16(value)
                    if len(residual):
                        value = value + load16(residual[m], n0)
                    store16(out[m], n0, value)
                continue
            for m in range(r0, min(r1, n_out)):  # the last half panel's columns, one by one
                for c in range(width):
                    value = sums[m - r0, c]
                    if len(bias):
                        value += bias[n0 + c]
                    if gelu:
                        value = gelu1(value)
                    if len(residual):
                        value += residual[m, n0 + c]
                    out[m, n0 + c] = value
        return out

    return matmul


@njit(inline="always")
def _tile(a, a_scales, w, start, d_w, m0, b, sums):
    """sums (6, 16) += block b of a[m0:m0 + 6] . the half panel's block from w[start], scaled (from zero when
    b == 0)."""
    c0 = c1 = c2 = c3 = c4 = c5 = int_zeros16()
    j0 = b * PAIRS
    for j in range(PAIRS):
        w0 = load16(w, start + j * LANES)
        c0, c1, c2 = (
            madd_pairs(c0, a[m0, j0 + j], w0),
            madd_pairs(c1, a[m0 + 1, j0 + j], w0),
            madd_pairs(c2, a[m0 + 2, j0 + j], w0),
        )
        c3, c4, c5 = (
            madd_pairs(c3, a[m0 + 3, j0 + j], w0),
            madd_pairs(c4, a[m0 + 4, j0 + j], w0),
            madd_pairs(c5, a[m0 + 5, j0 + j], w0),
        )
    _park(sums, 0, c0, d_w * a_scales[m0, b], b)
    _park(sums, 1, c1, d_w * a_scales[m0 + 1, b], b)
    _park(sums, 2, c2, d_w * a_scales[m0 + 2, b], b)
    _park(sums, 3, c3, d_w * a_scales[m0 + 3, b], b)
    _park(sums, 4, c4, d_w * a_scales[m0 + 4, b], b)
    _park(sums, 5, c5, d_w * a_scales[m0 + 5, b], b)


@njit(inline="always")
def _park(sums, r, isum, scale, b):
    """sums[r] += float32(isum) * scale, or = when b == 0."""
    before = zeros16() if b == 0 else load16(sums[r], 0)
    store16(sums[r], 0, before + to_float(isum) * scale)


_matmul = _build()
