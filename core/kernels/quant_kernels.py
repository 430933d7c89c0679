"""Quantized weights times 8-bit activations, in numba, following llama.cpp's CPU scheme.

out[t, n] = sum over the blocks b of weight row n of  f(integer dot of the block, its scales),
where the integer dot of a block is exact (int16/int32) and the float part is applied per block
and accumulated in float32 in the order of ggml's reference vec_dot (ggml-cpu/quants.c,
ggml_vec_dot_*_generic) for the 32-value blocks, and of ggml's x86 repack kernel for the K-quants
(ggml-cpu/arch/x86/repack.cpp, ggml_gemm_q4_K_8x8_q8_K: one float step per super-block, the mins in an
accumulator of their own, out = acc - acc_mins), so the numbers track llama.cpp's.

Three loop shapes compute the same numbers:

- `rows` (a few activation rows): one activation row against one weight row at a time, the
  innermost loop running over the block's values.
- `lanes` (many activation rows), portable: each weight block is decoded once and used for every
  activation row; the innermost loop runs over activation rows ("lanes"), which LLVM vectorises,
  so the activations come transposed, (K, lanes), lanes a multiple of LANE_MULTIPLE.
- `tiles`: every type repacked into 16-row tiles, on each tier with int8 dots: tile_kernels.py. The two
  shapes here are the portable tier's, and the reference the tile kernels are tested against.

Integer sums are exact in any order and the float steps are the same IEEE operations in every
shape, with no fastmath (so no fused multiply-adds), so a row's result is bitwise the same
whichever shape runs, however many rows the call has and wherever the row sits.

Weights stay as stored in the GGUF file, one row of blocks per output feature (uint8, (N, row_bytes)).
Each kernel is compiled once per weight type (weight_types.py: `WEIGHT_TYPES[qtype].kernels_on(tier)`), the
type and its block size constants inside it: with a run-time block size LLVM vectorises the wrong loop (3x
slower).
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from numba import njit, prange

from miro.core.kernels.cache_key import HELPERS, cached_variant
from miro.core.kernels.halfs import load_f16
from miro.core.kernels.quant_blocks import (
    KVALUES_MXFP4,
    MXFP4,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q6_K,
    Q8_0,
    add_block32,
    decode_block32,
    decode_superblock,
    e8m0_half,
)

LANE_MULTIPLE = 32  # the lanes kernels' activation count is padded to this: LLVM's int16 vector width
TILE_ROWS = 16  # weight rows that share each block of transposed activations while it is in L1


# ---------------------------------------------------------------- the lanes' integer dot products


@njit(inline="always")
def _weights16(u, j, step):
    """u[j], u[j + step], ..., u[j + 15*step] as a tuple: values, not memory, so LLVM keeps them
    in registers across the lane loop (it cannot know that the loop's stores leave u alone)."""
    return (
        u[j],
        u[j + step],
        u[j + 2 * step],
        u[j + 3 * step],
        u[j + 4 * step],
        u[j + 5 * step],
        u[j + 6 * step],
        u[j + 7 * step],
        u[j + 8 * step],
        u[j + 9 * step],
        u[j + 10 * step],
        u[j + 11 * step],
        u[j + 12 * step],
        u[j + 13 * step],
        u[j + 14 * step],
        u[j + 15 * step],
    )


@njit(inline="always")
def _dot16(w, a_t, k, step, t):
    """sum over i < 16 of w[i] * a_t[k + i*step, t]; the caller's cast sets the integer width."""
    return (
        w[0] * a_t[k, t]
        + w[1] * a_t[k + step, t]
        + w[2] * a_t[k + 2 * step, t]
        + w[3] * a_t[k + 3 * step, t]
        + w[4] * a_t[k + 4 * step, t]
        + w[5] * a_t[k + 5 * step, t]
        + w[6] * a_t[k + 6 * step, t]
        + w[7] * a_t[k + 7 * step, t]
        + w[8] * a_t[k + 8 * step, t]
        + w[9] * a_t[k + 9 * step, t]
        + w[10] * a_t[k + 10 * step, t]
        + w[11] * a_t[k + 11 * step, t]
        + w[12] * a_t[k + 12 * step, t]
        + w[13] * a_t[k + 13 * step, t]
        + w[14] * a_t[k + 14 * step, t]
        + w[15] * a_t[k + 15 * step, t]
    )


# ---------------------------------------------------------------- 32-value blocks


def lanes_32(qtype: int):
    block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)][1]
    helpers = HELPERS

    @cached_variant(GGMLQuantizationType(qtype).name, parallel=True)
    def matmul_lanes_32(w, a_t, d_t, s_t, qsum_t, out):
        """out (T, N) = w (N rows of 32-value blocks) times activations a_t (K, lanes) int8.

        d_t, s_t, qsum_t (K/32, lanes): the activation blocks' float16 scale, Q8_1 sum and integer
        sum. Lanes past T are padding.
        """
        helpers  # in numba's cache key: see cache_key.py
        n_out = w.shape[0]
        k, n_lanes = a_t.shape
        for tile in prange((n_out + TILE_ROWS - 1) // TILE_ROWS):
            n0 = tile * TILE_ROWS
            rows = min(TILE_ROWS, n_out - n0)
            u = np.empty(32, np.int16)
            part_lo = np.empty(n_lanes, np.int16)  # int16 sums where they cannot overflow
            part_hi = np.empty(n_lanes, np.int16)
            part_32 = np.empty(n_lanes, np.int32)
            acc = np.zeros((TILE_ROWS, n_lanes), np.float32)
            for b in range(k // 32):
                k0 = b * 32
                for r in range(rows):
                    d, m, offset = decode_block32(qtype, w[n0 + r], b * block_bytes, u)
                    lo, hi = _weights16(u, 0, 1), _weights16(u, 16, 1)
                    # exact integer sums, in a loop of their own so that LLVM gives the int16 ones
                    # 32 lanes per instruction (|u| <= 16, |a| <= 127: 32 4-bit or 16 5-bit values fit, and
                    # 16 of MXFP4's, |u| <= 12)
                    if qtype == Q8_0:
                        for t in range(n_lanes):
                            part_32[t] = _dot16(lo, a_t, k0, 1, t) + _dot16(hi, a_t, k0 + 16, 1, t)
                    elif qtype == Q5_0 or qtype == Q5_1 or qtype == MXFP4:
                        for t in range(n_lanes):
                            part_lo[t] = _dot16(lo, a_t, k0, 1, t)
                            part_hi[t] = _dot16(hi, a_t, k0 + 16, 1, t)
                    else:
                        for t in range(n_lanes):
                            part_lo[t] = _dot16(lo, a_t, k0, 1, t) + _dot16(hi, a_t, k0 + 16, 1, t)
                    acc_r = acc[r]
                    for t in range(n_lanes):
                        if qtype == Q8_0:
                            isum = part_32[t]
                        elif qtype == Q5_0 or qtype == Q5_1 or qtype == MXFP4:
                            isum = np.int32(part_lo[t]) + np.int32(part_hi[t])
                        else:
                            isum = np.int32(part_lo[t])
                        isum = np.int32(isum + offset * qsum_t[b, t])
                        acc_r[t] = add_block32(qtype, acc_r[t], np.float32(isum), d, m, d_t[b, t], s_t[b, t])
            for r in range(rows):
                for t in range(out.shape[0]):
                    out[t, n0 + r] = acc[r, t]
        return out

    return matmul_lanes_32


@njit(inline="always")
def _dot_row_block32(qtype, row, off, a, k0, sixteen):
    """ggml's integer sum of one block against one activation row, from the raw bytes.

    `sixteen` is 16, passed at run time: with a constant trip count LLVM unrolls these loops into
    scalar code, with a variable one it vectorises them.
    """
    isum = np.int32(0)
    if qtype == Q8_0:
        for j in range(2 * sixteen):
            isum = np.int32(isum + np.int32(np.int8(row[off + 2 + j])) * np.int32(a[k0 + j]))
        return isum
    if qtype == MXFP4:
        for j in range(sixteen):
            byte = np.int32(row[off + 1 + j])
            isum = np.int32(
                isum
                + np.int32(KVALUES_MXFP4[byte & 15]) * np.int32(a[k0 + j])
                + np.int32(KVALUES_MXFP4[byte >> 4]) * np.int32(a[k0 + 16 + j])
            )
        return isum
    if qtype == Q4_0 or qtype == Q4_1:
        nibbles = off + 2 if qtype == Q4_0 else off + 4
        for j in range(sixteen):
            byte = np.int32(row[nibbles + j])
            isum = np.int32(
                isum + np.int32((byte & 15) * np.int32(a[k0 + j])) + np.int32((byte >> 4) * np.int32(a[k0 + 16 + j]))
            )
        return isum
    qh = off + 2 if qtype == Q5_0 else off + 4
    high_bits = (
        np.uint32(row[qh])
        | (np.uint32(row[qh + 1]) << 8)
        | (np.uint32(row[qh + 2]) << 16)
        | (np.uint32(row[qh + 3]) << 24)
    )
    for j in range(sixteen):
        byte = np.int32(row[qh + 4 + j])
        lo = (byte & 15) | np.int32(((high_bits >> j) & 1) << 4)
        hi = (byte >> 4) | np.int32(((high_bits >> (j + 16)) & 1) << 4)
        isum = np.int32(isum + np.int32(lo * np.int32(a[k0 + j])) + np.int32(hi * np.int32(a[k0 + 16 + j])))
    return isum


def rows_32(qtype: int):
    block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)][1]
    helpers = HELPERS
    # the unsigned weights' offset: ggml's sum is sum(q * a) + offset * sum(a)
    offset = -8 if qtype == Q4_0 else (-16 if qtype == Q5_0 else 0)

    @cached_variant(GGMLQuantizationType(qtype).name, parallel=True)
    def matmul_rows_32(w, a, d, s, qsum, out, sixteen):
        """out (T, N) = w (N rows of 32-value blocks) times activations a (T, K) int8, row by row.

        d, s, qsum (T, K/32) as for the lanes kernel; the same numbers, for small T.
        """
        helpers  # in numba's cache key: see cache_key.py
        n_out = w.shape[0]
        n_tok, k = a.shape
        for n in prange(n_out):
            row = w[n]
            for t in range(n_tok):
                sumf = np.float32(0.0)
                for b in range(k // 32):
                    off = b * block_bytes
                    isum = np.int32(_dot_row_block32(qtype, row, off, a[t], b * 32, sixteen) + offset * qsum[t, b])
                    m = load_f16(row, off + 2) if qtype == Q4_1 or qtype == Q5_1 else np.float32(0.0)
                    d_w = e8m0_half(row[off]) if qtype == MXFP4 else load_f16(row, off)
                    sumf = add_block32(qtype, sumf, np.float32(isum), d_w, m, d[t, b], s[t, b])
                out[t, n] = sumf
        return out

    return matmul_rows_32


# ---------------------------------------------------------------- K-quant super-blocks


def lanes_k(qtype: int):
    block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)][1]
    helpers = HELPERS

    @cached_variant(GGMLQuantizationType(qtype).name, parallel=True)
    def matmul_lanes_k(w, a_t, d_t, sum32_t, out, sixteen):
        """out (T, N) = w (N rows of K-quant super-blocks) times Q8_K activations a_t (K, lanes) int8.

        d_t (K/256, lanes): the activation blocks' float32 scales; sum32_t (K/32, lanes): the
        integer sum of each 32 activations (ggml's bsums, two by two). Lanes past T are padding.
        """
        helpers  # in numba's cache key: see cache_key.py
        n_out = w.shape[0]
        k, n_lanes = a_t.shape
        for tile in prange((n_out + TILE_ROWS - 1) // TILE_ROWS):
            n0 = tile * TILE_ROWS
            rows = min(TILE_ROWS, n_out - n0)
            u = np.empty((TILE_ROWS, 256), np.int16)
            mins = np.empty((TILE_ROWS, 8), np.int32)
            d = np.empty(TILE_ROWS, np.float32)
            dmin = np.empty(TILE_ROWS, np.float32)
            row_sum = np.empty((TILE_ROWS, n_lanes), np.int32)  # a super-block's integer sum per row and lane
            acc = np.zeros((TILE_ROWS, n_lanes), np.float32)
            acc_mins = np.zeros((TILE_ROWS, n_lanes), np.float32)
            for sb in range(k // 256):
                k0 = sb * 256
                for r in range(rows):
                    d[r], dmin[r] = decode_superblock(qtype, w[n0 + r], sb * block_bytes, u[r], mins[r], sixteen)
                row_sum[:] = 0
                for lane in range(8):  # the lane's 32 activation rows stay in L1 for the tile's rows
                    for r in range(rows):
                        lo, hi = _weights16(u[r], lane, 8), _weights16(u[r], lane + 128, 8)
                        sum_r = row_sum[r]
                        for t in range(n_lanes):
                            sum_r[t] += _dot16(lo, a_t, k0 + lane, 8, t) + _dot16(hi, a_t, k0 + 128 + lane, 8, t)
                for r in range(rows):
                    acc_r, sum_r, d_r = acc[r], row_sum[r], d[r]
                    for t in range(n_lanes):
                        acc_r[t] += (d_r * d_t[sb, t]) * np.float32(sum_r[t])
                if qtype != Q6_K:
                    g = sb * 8
                    for r in range(rows):
                        m0, m1, m2, m3, m4, m5, m6, m7 = (
                            mins[r, 0],
                            mins[r, 1],
                            mins[r, 2],
                            mins[r, 3],
                            mins[r, 4],
                            mins[r, 5],
                            mins[r, 6],
                            mins[r, 7],
                        )
                        acc_mins_r, dmin_r = acc_mins[r], dmin[r]
                        for t in range(n_lanes):
                            sum_mins = (
                                m0 * sum32_t[g, t]
                                + m1 * sum32_t[g + 1, t]
                                + m2 * sum32_t[g + 2, t]
                                + m3 * sum32_t[g + 3, t]
                                + m4 * sum32_t[g + 4, t]
                                + m5 * sum32_t[g + 5, t]
                                + m6 * sum32_t[g + 6, t]
                                + m7 * sum32_t[g + 7, t]
                            )
                            acc_mins_r[t] += (dmin_r * d_t[sb, t]) * np.float32(np.int32(sum_mins))
            for r in range(rows):
                for t in range(out.shape[0]):
                    out[t, n0 + r] = acc[r, t] - acc_mins[r, t]
        return out

    return matmul_lanes_k


def rows_k(qtype: int):
    block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)][1]
    helpers = HELPERS

    @cached_variant(GGMLQuantizationType(qtype).name, parallel=True)
    def matmul_rows_k(w, a, d, sum32, out, sixteen):
        """out (T, N) = w (N rows of K-quant super-blocks) times Q8_K activations a (T, K), row by row.

        d (T, K/256), sum32 (T, K/32) as for the lanes kernel; the same numbers, for small T.
        `sixteen` is 16, passed at run time so that LLVM vectorises the loops over a super-block.
        """
        helpers  # in numba's cache key: see cache_key.py
        n_out = w.shape[0]
        n_tok, k = a.shape
        for n in prange(n_out):
            row = w[n]
            u = np.empty(256, np.int16)
            mins = np.empty(8, np.int32)
            prod = np.empty(256, np.int32)
            acc = np.zeros(n_tok, np.float32)
            acc_mins = np.zeros(n_tok, np.float32)
            for sb in range(k // 256):
                d_w, dmin = decode_superblock(qtype, row, sb * block_bytes, u, mins, sixteen)
                k0 = sb * 256
                for t in range(n_tok):
                    a_t = a[t]
                    for e in range(16 * sixteen):
                        prod[e] = np.int32(u[e]) * np.int32(a_t[k0 + e])
                    total = np.int32(0)
                    for e in range(16 * sixteen):
                        total += prod[e]
                    acc[t] += (d_w * d[t, sb]) * np.float32(total)
                    if qtype != Q6_K:
                        sum_mins = 0
                        for j in range(8):
                            sum_mins += mins[j] * sum32[t, sb * 8 + j]
                        acc_mins[t] += (dmin * d[t, sb]) * np.float32(np.int32(sum_mins))
            for t in range(n_tok):
                out[t, n] = acc[t] - acc_mins[t]
        return out

    return matmul_rows_k
