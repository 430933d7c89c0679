"""Quantized weights times 8-bit activations, in numba, following llama.cpp's CPU scheme.

out[t, n] = sum over the blocks b of weight row n of  f(integer dot of the block, its scales),
where the integer dot of a block is exact (int16/int32) and the float part is applied per block
and accumulated in float32 in the order of ggml's reference vec_dot (ggml-cpu/quants.c,
ggml_vec_dot_*_generic), so the numbers track llama.cpp's.

Two loop shapes compute the same numbers:

- `matmul_lanes_*` (many activation rows): each weight block is decoded once and used for every
  activation row; the innermost loop runs over activation rows ("lanes"), which LLVM vectorises,
  so the activations come transposed, (K, T).
- `matmul_rows_*` (a few activation rows): one row against one weight row at a time, the
  innermost loop running over the block's values.

Integer sums are exact in any order and the float steps are the same IEEE operations in both
shapes, with no fastmath (so no fused multiply-adds), so a row's result is bitwise the same
whichever shape runs, however many rows the call has and wherever the row sits.

Weights stay as stored in the GGUF file, one row of blocks per output feature (uint8, (N, row_bytes)).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from numba import njit, prange

from .halfs import load_f16

Q4_0 = int(GGMLQuantizationType.Q4_0)
Q4_1 = int(GGMLQuantizationType.Q4_1)
Q5_0 = int(GGMLQuantizationType.Q5_0)
Q5_1 = int(GGMLQuantizationType.Q5_1)
Q8_0 = int(GGMLQuantizationType.Q8_0)
Q4_K = int(GGMLQuantizationType.Q4_K)
Q5_K = int(GGMLQuantizationType.Q5_K)
Q6_K = int(GGMLQuantizationType.Q6_K)

BLOCK32_TYPES = (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)
SUPERBLOCK_TYPES = (Q4_K, Q5_K, Q6_K)

TILE_ROWS = 4  # weight rows that share each block of transposed activations while it is in L1

# Block layouts (ggml-common.h), 32 values per block; "nibbles" are 16 bytes whose byte j holds
# value j in its low 4 bits and value j + 16 in its high 4 bits; qh is a little-endian uint32 whose
# bit j is the 5th bit of value j.
#   Q4_0, 18 bytes: f16 d | nibbles                 value = d * (q - 8)
#   Q4_1, 20 bytes: f16 d | f16 m | nibbles         value = d * q + m
#   Q5_0, 22 bytes: f16 d | qh | nibbles            value = d * (q - 16)
#   Q5_1, 24 bytes: f16 d | f16 m | qh | nibbles    value = d * q + m
#   Q8_0, 34 bytes: f16 d | 32 int8                 value = d * q


@njit(inline="always")
def _decode_block32(qtype, row, off, u):
    """Write one block's 32 integers, centred on 0, into u (int16); return (d, m, zero).

    The block's dot with activations a is sum(u * a) + zero * sum(a): the centring keeps the
    4- and 5-bit sums within int16 and `zero` gives back ggml's integer sum exactly.
    """
    d = load_f16(row, off)
    m = np.float32(0.0)
    zero = 0
    if qtype == Q8_0:
        for j in range(32):
            u[j] = np.int8(row[off + 2 + j])
        return d, m, zero
    if qtype == Q4_0 or qtype == Q4_1:
        centre = 8
        nibbles = off + 2 if qtype == Q4_0 else off + 4
        high_bits = np.uint32(0)
    else:
        centre = 16
        qh = off + 2 if qtype == Q5_0 else off + 4
        nibbles = qh + 4
        high_bits = (np.uint32(row[qh]) | (np.uint32(row[qh + 1]) << 8)
                     | (np.uint32(row[qh + 2]) << 16) | (np.uint32(row[qh + 3]) << 24))
    if qtype == Q4_1 or qtype == Q5_1:
        m = load_f16(row, off + 2)
        zero = centre
    for j in range(16):
        byte = np.int32(row[nibbles + j])
        u[j] = (byte & 15) + (((high_bits >> j) & 1) << 4) - centre
        u[j + 16] = (byte >> 4) + (((high_bits >> (j + 16)) & 1) << 4) - centre
    return d, m, zero


@njit(cache=True)
def dot_lanes(u, u0, step, count, a_t, k0, out):
    """out[t] = sum over i < count of u[u0 + i*step] * a_t[k0 + i*step, t], for every lane t.

    The hot loop: eight weights per pass over the lanes, the lanes innermost so LLVM vectorises
    them. out's dtype is the width of the integer arithmetic: int16 doubles the lanes per
    instruction where the caller knows the sum fits. count is a multiple of 8.
    """
    n = out.shape[0]
    for t in range(n):
        out[t] = 0
    for i in range(0, count, 8):
        j = u0 + i * step
        k = k0 + i * step
        w0, w1, w2, w3 = u[j], u[j + step], u[j + 2 * step], u[j + 3 * step]
        w4, w5, w6, w7 = u[j + 4 * step], u[j + 5 * step], u[j + 6 * step], u[j + 7 * step]
        k1, k2, k3, k4, k5, k6, k7 = k + step, k + 2 * step, k + 3 * step, k + 4 * step, k + 5 * step, k + 6 * step, k + 7 * step
        for t in range(n):
            out[t] += (w0 * a_t[k, t] + w1 * a_t[k1, t] + w2 * a_t[k2, t] + w3 * a_t[k3, t]
                       + w4 * a_t[k4, t] + w5 * a_t[k5, t] + w6 * a_t[k6, t] + w7 * a_t[k7, t])


@njit(cache=True, parallel=True)
def matmul_lanes_32(qtype, w, a_t, d_t, s_t, qsum_t, out):
    """out (T, N) = w (N rows of 32-value blocks) times activations a_t (K, T) int8.

    d_t, s_t, qsum_t (K/32, T): the activation blocks' float16 scale, Q8_1 sum and integer sum.
    """
    n_out = w.shape[0]
    k, n_tok = a_t.shape
    n_blocks = k // 32
    block_bytes = w.shape[1] // n_blocks
    # Where int16 sums cannot overflow (|centred weight| <= 16, |activation| <= 127): 32 values
    # of a 4-bit type or 16 of a 5-bit type. Q8_0 sums in int32.
    halves = qtype == Q5_0 or qtype == Q5_1
    for tile in prange((n_out + TILE_ROWS - 1) // TILE_ROWS):
        n0 = tile * TILE_ROWS
        rows = min(TILE_ROWS, n_out - n0)
        u = np.empty(32, np.int16)
        part_lo = np.empty(n_tok, np.int16)
        part_hi = np.zeros(n_tok, np.int16)
        part_32 = np.empty(n_tok, np.int32)
        isum = np.empty(n_tok, np.int32)
        acc = np.zeros((TILE_ROWS, n_tok), np.float32)
        for b in range(n_blocks):
            k0 = b * 32
            for r in range(rows):
                d, m, zero = _decode_block32(qtype, w[n0 + r], b * block_bytes, u)
                if qtype == Q8_0:
                    dot_lanes(u, 0, 1, 32, a_t, k0, part_32)
                    for t in range(n_tok):
                        isum[t] = part_32[t]
                elif halves:
                    dot_lanes(u, 0, 1, 16, a_t, k0, part_lo)
                    dot_lanes(u, 16, 1, 16, a_t, k0 + 16, part_hi)
                    for t in range(n_tok):
                        isum[t] = np.int32(part_lo[t]) + np.int32(part_hi[t]) + zero * qsum_t[b, t]
                else:
                    dot_lanes(u, 0, 1, 32, a_t, k0, part_lo)
                    for t in range(n_tok):
                        isum[t] = np.int32(part_lo[t]) + zero * qsum_t[b, t]
                acc_r = acc[r]
                # ggml's float steps per block, operation for operation
                if qtype == Q4_0:
                    for t in range(n_tok):
                        acc_r[t] += (np.float32(isum[t]) * d) * d_t[b, t]
                elif qtype == Q4_1 or qtype == Q5_1:
                    for t in range(n_tok):
                        acc_r[t] += (d * d_t[b, t]) * np.float32(isum[t]) + m * s_t[b, t]
                else:  # Q5_0, Q8_0
                    for t in range(n_tok):
                        acc_r[t] += (d * d_t[b, t]) * np.float32(isum[t])
        for r in range(rows):
            for t in range(n_tok):
                out[t, n0 + r] = acc[r, t]
    return out


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
    if qtype == Q4_0 or qtype == Q4_1:
        nibbles = off + 2 if qtype == Q4_0 else off + 4
        for j in range(sixteen):
            byte = np.int32(row[nibbles + j])
            isum = np.int32(isum + np.int32((byte & 15) * np.int32(a[k0 + j]))
                            + np.int32((byte >> 4) * np.int32(a[k0 + 16 + j])))
        return isum
    qh = off + 2 if qtype == Q5_0 else off + 4
    high_bits = (np.uint32(row[qh]) | (np.uint32(row[qh + 1]) << 8)
                 | (np.uint32(row[qh + 2]) << 16) | (np.uint32(row[qh + 3]) << 24))
    for j in range(sixteen):
        byte = np.int32(row[qh + 4 + j])
        lo = (byte & 15) | np.int32(((high_bits >> j) & 1) << 4)
        hi = (byte >> 4) | np.int32(((high_bits >> (j + 16)) & 1) << 4)
        isum = np.int32(isum + np.int32(lo * np.int32(a[k0 + j])) + np.int32(hi * np.int32(a[k0 + 16 + j])))
    return isum


@njit(cache=True, parallel=True)
def matmul_rows_32(qtype, w, a, d, s, qsum, out, sixteen):
    """out (T, N) = w (N rows of 32-value blocks) times activations a (T, K) int8, row by row.

    d, s, qsum (T, K/32) as for matmul_lanes_32; the same numbers, for small T.
    """
    n_out = w.shape[0]
    n_tok, k = a.shape
    n_blocks = k // 32
    block_bytes = w.shape[1] // n_blocks
    # the unsigned weights' offset: ggml's sum is sum(q * a) + offset * sum(a)
    offset = -8 if qtype == Q4_0 else (-16 if qtype == Q5_0 else 0)
    for n in prange(n_out):
        row = w[n]
        for t in range(n_tok):
            sumf = np.float32(0.0)
            for b in range(n_blocks):
                off = b * block_bytes
                isum = _dot_row_block32(qtype, row, off, a[t], b * 32, sixteen) + offset * qsum[t, b]
                dw = load_f16(row, off)
                if qtype == Q4_0:
                    sumf += (np.float32(isum) * dw) * d[t, b]
                elif qtype == Q4_1 or qtype == Q5_1:
                    sumf += (dw * d[t, b]) * np.float32(isum) + load_f16(row, off + 2) * s[t, b]
                else:
                    sumf += (dw * d[t, b]) * np.float32(isum)
            out[t, n] = sumf
    return out


# K-quant super-blocks of 256 values in 8 sub-blocks of 32 (Q6_K: 16 of 16), ggml-common.h:
#   Q4_K, 144 bytes: f16 d | f16 dmin | 12 bytes of 6-bit scales and mins | 128 bytes of 4-bit q
#     q bytes 32c..32c+31 hold sub-block 2c (low nibbles) and 2c+1 (high); value = d*sc*q - dmin*m
#   Q5_K, 176 bytes: as Q4_K with 32 bytes qh after the scales: bit s of qh[i] is the 5th bit of
#     value i of sub-block s
#   Q6_K, 210 bytes: 128 bytes ql | 64 bytes qh | 16 int8 scales | f16 d; value = d*sc*(q - 32)
# ggml's reference dot keeps 8 int32 lanes (value i goes to lane i % 8) and 8 float sums per row;
# the float sums are added together only at the end, so the lanes are kept here too.


@njit(inline="always")
def _scale_min_k4(j, scales, off):
    """Sub-block j's 6-bit scale and min from Q4_K/Q5_K's 12 packed bytes (get_scale_min_k4)."""
    if j < 4:
        return np.int32(scales[off + j] & 63), np.int32(scales[off + j + 4] & 63)
    sc = (scales[off + j + 4] & 15) | ((scales[off + j - 4] >> 6) << 4)
    mn = (scales[off + j + 4] >> 4) | ((scales[off + j] >> 6) << 4)
    return np.int32(sc), np.int32(mn)


@njit(inline="always")
def _decode_superblock(qtype, row, off, u, mins):
    """Write a super-block's 256 integers times their sub-block scale into u (int16) and the
    sub-block minimums into mins (int32, 8); return (d, dmin)."""
    if qtype == Q6_K:
        for half in range(2):
            ql = off + 64 * half
            qh = off + 128 + 32 * half
            e0 = 128 * half
            for i in range(32):
                h = np.int32(row[qh + i])
                lo = np.int32(row[ql + i])
                lo2 = np.int32(row[ql + 32 + i])
                u[e0 + i] = (lo & 15) | ((h & 3) << 4)
                u[e0 + 32 + i] = (lo2 & 15) | (((h >> 2) & 3) << 4)
                u[e0 + 64 + i] = (lo >> 4) | (((h >> 4) & 3) << 4)
                u[e0 + 96 + i] = (lo2 >> 4) | (((h >> 6) & 3) << 4)
        for e in range(256):
            u[e] = np.int32(np.int8(row[off + 192 + e // 16])) * (np.int32(u[e]) - 32)
        for j in range(8):
            mins[j] = 0
        return load_f16(row, off + 208), np.float32(0.0)
    qs = off + 16 if qtype == Q4_K else off + 48
    for s in range(8):
        sc, mn = _scale_min_k4(s, row, off + 4)
        mins[s] = mn
        byte0 = qs + 32 * (s // 2)
        shift = 4 * (s % 2)
        for i in range(32):
            q = (np.int32(row[byte0 + i]) >> shift) & 15
            if qtype == Q5_K:
                q += ((np.int32(row[off + 16 + i]) >> s) & 1) << 4
            u[32 * s + i] = sc * q
    return load_f16(row, off), load_f16(row, off + 2)


@njit(cache=True, parallel=True)
def matmul_lanes_k(qtype, w, a_t, d_t, sum32_t, out):
    """out (T, N) = w (N rows of K-quant super-blocks) times Q8_K activations a_t (K, T) int8.

    d_t (K/256, T): the activation blocks' float32 scales; sum32_t (K/32, T): the integer sum of
    each 32 activations (ggml's bsums, two by two).
    """
    n_out = w.shape[0]
    k, n_tok = a_t.shape
    n_super = k // 256
    block_bytes = w.shape[1] // n_super
    for tile in prange((n_out + TILE_ROWS - 1) // TILE_ROWS):
        n0 = tile * TILE_ROWS
        rows = min(TILE_ROWS, n_out - n0)
        u = np.empty(256, np.int16)
        mins = np.empty(8, np.int32)
        lanes = np.empty((8, n_tok), np.int32)
        sum_mins = np.empty(n_tok, np.int32)
        sums = np.zeros((TILE_ROWS, 8, n_tok), np.float32)  # ggml's sums[8]
        sumf = np.zeros((TILE_ROWS, n_tok), np.float32)  # ggml's sumf
        for sb in range(n_super):
            k0 = sb * 256
            for r in range(rows):
                d, dmin = _decode_superblock(qtype, w[n0 + r], sb * block_bytes, u, mins)
                for lane in range(8):
                    dot_lanes(u, lane, 8, 32, a_t, k0 + lane, lanes[lane])
                for lane in range(8):
                    sums_l = sums[r, lane]
                    lane_sum = lanes[lane]
                    for t in range(n_tok):
                        sums_l[t] += (d * d_t[sb, t]) * np.float32(lane_sum[t])
                if qtype != Q6_K:
                    m0, m1, m2, m3, m4, m5, m6, m7 = mins[0], mins[1], mins[2], mins[3], mins[4], mins[5], mins[6], mins[7]
                    g = sb * 8
                    for t in range(n_tok):
                        sum_mins[t] = (m0 * sum32_t[g, t] + m1 * sum32_t[g + 1, t] + m2 * sum32_t[g + 2, t]
                                       + m3 * sum32_t[g + 3, t] + m4 * sum32_t[g + 4, t] + m5 * sum32_t[g + 5, t]
                                       + m6 * sum32_t[g + 6, t] + m7 * sum32_t[g + 7, t])
                    sumf_r = sumf[r]
                    for t in range(n_tok):
                        sumf_r[t] -= (dmin * d_t[sb, t]) * np.float32(sum_mins[t])
        for r in range(rows):
            for t in range(n_tok):
                total = sumf[r, t]
                for lane in range(8):
                    total += sums[r, lane, t]
                out[t, n0 + r] = total
    return out


@njit(cache=True, parallel=True)
def matmul_rows_k(qtype, w, a, d, sum32, out, two_fifty_six):
    """out (T, N) = w (N rows of K-quant super-blocks) times Q8_K activations a (T, K), row by row.

    d (T, K/256), sum32 (T, K/32) as for matmul_lanes_k; the same numbers, for small T.
    `two_fifty_six` is 256, passed at run time so LLVM vectorises the loops over a super-block.
    """
    n_out = w.shape[0]
    n_tok, k = a.shape
    n_super = k // 256
    block_bytes = w.shape[1] // n_super
    for n in prange(n_out):
        row = w[n]
        u = np.empty(256, np.int16)
        mins = np.empty(8, np.int32)
        prod = np.empty(256, np.int32)
        sums = np.zeros((n_tok, 8), np.float32)
        sumf = np.zeros(n_tok, np.float32)
        for sb in range(n_super):
            d_w, dmin = _decode_superblock(qtype, row, sb * block_bytes, u, mins)
            k0 = sb * 256
            for t in range(n_tok):
                a_t = a[t]
                for e in range(two_fifty_six):
                    prod[e] = np.int32(u[e]) * np.int32(a_t[k0 + e])
                # fold to the 8 lanes of ggml's dot: value e goes to lane e % 8
                half = two_fifty_six // 2
                while half >= 8:
                    for e in range(half):
                        prod[e] += prod[e + half]
                    half //= 2
                scale = d_w * d[t, sb]
                for lane in range(8):
                    sums[t, lane] += scale * np.float32(prod[lane])
                if qtype != Q6_K:
                    sum_mins = 0
                    for j in range(8):
                        sum_mins += mins[j] * sum32[t, sb * 8 + j]
                    sumf[t] -= (dmin * d[t, sb]) * np.float32(np.int32(sum_mins))
        for t in range(n_tok):
            total = sumf[t]
            for lane in range(8):
                total += sums[t, lane]
            out[t, n] = total
    return out
