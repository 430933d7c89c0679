"""Quantized weights times 8-bit activations, in numba, following llama.cpp's CPU scheme.

out[t, n] = sum over the blocks b of weight row n of  f(integer dot of the block, its scales),
where the integer dot of a block is exact (int16/int32) and the float part is applied per block
and accumulated in float32 in the order of ggml's reference vec_dot (ggml-cpu/quants.c,
ggml_vec_dot_*_generic), so the numbers track llama.cpp's.

Two loop shapes compute the same numbers:

- `lanes` (many activation rows): each weight block is decoded once and used for every
  activation row; the innermost loop runs over activation rows ("lanes"), which LLVM vectorises,
  so the activations come transposed, (K, lanes), lanes a multiple of LANE_MULTIPLE.
- `rows` (a few activation rows): one activation row against one weight row at a time, the
  innermost loop running over the block's values.

Integer sums are exact in any order and the float steps are the same IEEE operations in both
shapes, with no fastmath (so no fused multiply-adds), so a row's result is bitwise the same
whichever shape runs, however many rows the call has and wherever the row sits.

Weights stay as stored in the GGUF file, one row of blocks per output feature (uint8, (N, row_bytes)).
Each kernel is compiled once per weight type (`kernels_for(qtype)`), the type and its block size
constants inside it: with a run-time block size LLVM vectorises the wrong loop (3x slower).
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from numba import njit, prange

from . import vnni
from .halfs import load_f16
from .simd import LANES, load16, store16, to_float, zeros16

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

LANE_MULTIPLE = 32  # the lanes kernels' activation count is padded to this: LLVM's int16 vector width
TILE_ROWS = 16  # weight rows that share each block of transposed activations while it is in L1


# ---------------------------------------------------------------- the integer dot products


@njit(inline="always")
def _weights16(u, j, step):
    """u[j], u[j + step], ..., u[j + 15*step] as a tuple: values, not memory, so LLVM keeps them
    in registers across the lane loop (it cannot know that the loop's stores leave u alone)."""
    return (u[j], u[j + step], u[j + 2 * step], u[j + 3 * step], u[j + 4 * step], u[j + 5 * step],
            u[j + 6 * step], u[j + 7 * step], u[j + 8 * step], u[j + 9 * step], u[j + 10 * step],
            u[j + 11 * step], u[j + 12 * step], u[j + 13 * step], u[j + 14 * step], u[j + 15 * step])


@njit(inline="always")
def _dot16(w, a_t, k, step, t):
    """sum over i < 16 of w[i] * a_t[k + i*step, t]; the caller's cast sets the integer width."""
    return (w[0] * a_t[k, t] + w[1] * a_t[k + step, t] + w[2] * a_t[k + 2 * step, t]
            + w[3] * a_t[k + 3 * step, t] + w[4] * a_t[k + 4 * step, t] + w[5] * a_t[k + 5 * step, t]
            + w[6] * a_t[k + 6 * step, t] + w[7] * a_t[k + 7 * step, t] + w[8] * a_t[k + 8 * step, t]
            + w[9] * a_t[k + 9 * step, t] + w[10] * a_t[k + 10 * step, t] + w[11] * a_t[k + 11 * step, t]
            + w[12] * a_t[k + 12 * step, t] + w[13] * a_t[k + 13 * step, t] + w[14] * a_t[k + 14 * step, t]
            + w[15] * a_t[k + 15 * step, t])


# ---------------------------------------------------------------- 32-value blocks
# Block layouts (ggml-common.h); "nibbles" are 16 bytes whose byte j holds value j in its low
# 4 bits and value j + 16 in its high 4 bits; qh is a little-endian uint32 whose bit j is the
# 5th bit of value j.
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


@njit(inline="always")
def _add_block32(qtype, acc, isum, d, m, d_act, s_act):
    """acc plus one block's contribution: ggml's float steps, operation for operation.

    isum: ggml's integer sum, as float32 (exact); d, m: the weight block's scale and min;
    d_act, s_act: the activation block's float16 scale and Q8_1 sum. acc, isum, d_act, s_act
    are float32 scalars, or float32x16 for 16 activation rows at once: the same IEEE steps.
    """
    if qtype == Q4_0:
        return acc + (isum * d) * d_act
    if qtype == Q4_1 or qtype == Q5_1:
        return acc + ((d * d_act) * isum + m * s_act)
    return acc + (d * d_act) * isum  # Q5_0, Q8_0


@njit(inline="always")
def _load_u32(row, at):
    return (np.uint32(row[at]) | (np.uint32(row[at + 1]) << 8)
            | (np.uint32(row[at + 2]) << 16) | (np.uint32(row[at + 3]) << 24))


@njit(inline="always")
def _spread_bits(bits):
    """4 bits to bit 4 of each byte of a uint32 (the 5th bits of 4 values)."""
    return (bits & 1) << 4 | (bits & 2) << 11 | (bits & 4) << 18 | (bits & 8) << 25


@njit(inline="always")
def _weight_quads(qtype, row, off):
    """One block's 32 weights as 8 uint32 of 4 unsigned bytes (values 4q..4q+3 in quad q): ggml's
    integer sum is sum(quads * a) + _quads_offset(qtype) * sum(a). Q8_0's int8 weights get +128
    (a flipped top bit) to be unsigned, as vpdpbusd wants one operand unsigned."""
    mask = np.uint32(0x0F0F0F0F)
    if qtype == Q8_0:
        flip = np.uint32(0x80808080)
        return (_load_u32(row, off + 2) ^ flip, _load_u32(row, off + 6) ^ flip, _load_u32(row, off + 10) ^ flip,
                _load_u32(row, off + 14) ^ flip, _load_u32(row, off + 18) ^ flip, _load_u32(row, off + 22) ^ flip,
                _load_u32(row, off + 26) ^ flip, _load_u32(row, off + 30) ^ flip)
    if qtype == Q4_0 or qtype == Q4_1:
        at = off + 2 if qtype == Q4_0 else off + 4
        lo, hi = np.uint32(0), np.uint32(0)  # no 5th bits
    else:
        qh = off + 2 if qtype == Q5_0 else off + 4
        at = qh + 4
        lo, hi = _load_u32(row, qh) & 0xFFFF, _load_u32(row, qh) >> 16
    w0, w1, w2, w3 = _load_u32(row, at), _load_u32(row, at + 4), _load_u32(row, at + 8), _load_u32(row, at + 12)
    return (w0 & mask | _spread_bits(lo), w1 & mask | _spread_bits(lo >> 4), w2 & mask | _spread_bits(lo >> 8),
            w3 & mask | _spread_bits(lo >> 12), (w0 >> 4) & mask | _spread_bits(hi), (w1 >> 4) & mask | _spread_bits(hi >> 4),
            (w2 >> 4) & mask | _spread_bits(hi >> 8), (w3 >> 4) & mask | _spread_bits(hi >> 12))


def _quads_offset(qtype: int) -> int:
    return {Q4_0: -8, Q5_0: -16, Q8_0: -128}.get(qtype, 0)


def _lanes_32_vnni(qtype: int):
    block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)][1]
    has_min = qtype == Q4_1 or qtype == Q5_1
    offset = _quads_offset(qtype)

    @njit(cache=True, parallel=True)
    def matmul_lanes_32_vnni(w, a_groups, d_t, s_t, qsum_t, out):
        """The lanes kernel with AVX512-VNNI: the same numbers as matmul_lanes_32.

        a_groups (lanes / 16, K / 4, 16) uint32: lane l of group g's 4 activations 4q..4q+3 at
        [g, q, l]. d_t, s_t, qsum_t (K / 32, lanes).
        A micro-kernel: two weight rows times 16 lanes, sums in registers over all the blocks.
        """
        n_out = w.shape[0]
        n_groups, n_quads, _ = a_groups.shape
        n_blocks, n_lanes = n_quads // 8, n_groups * LANES
        a_flat = a_groups.reshape(n_groups * n_quads * LANES)
        d_flat, s_flat, qsum_flat = d_t.reshape(n_blocks * n_lanes), s_t.reshape(n_blocks * n_lanes), qsum_t.reshape(n_blocks * n_lanes)
        for tile in prange((n_out + TILE_ROWS - 1) // TILE_ROWS):
            n0 = tile * TILE_ROWS
            rows = min(TILE_ROWS, n_out - n0)
            # the tile's weights decoded once, for every lane group (rows past the matrix stay zero)
            quads = np.zeros(TILE_ROWS * n_blocks * 8, np.uint32)
            d = np.zeros((TILE_ROWS, n_blocks), np.float32)
            m = np.zeros((TILE_ROWS, n_blocks), np.float32)
            for r in range(rows):
                row = w[n0 + r]
                for b in range(n_blocks):
                    off = b * block_bytes
                    at = (r * n_blocks + b) * 8
                    (quads[at], quads[at + 1], quads[at + 2], quads[at + 3],
                     quads[at + 4], quads[at + 5], quads[at + 6], quads[at + 7]) = _weight_quads(qtype, row, off)
                    d[r, b] = load_f16(row, off)
                    m[r, b] = load_f16(row, off + 2) if has_min else np.float32(0.0)
            result = np.empty(LANES, np.float32)
            for g in range(n_groups):
                for r in range(0, rows, 2):
                    acc0, acc1 = zeros16(), zeros16()
                    for b in range(n_blocks):
                        isum0, isum1 = vnni.dot_block_rows2(a_flat, (g * n_quads + 8 * b) * LANES, quads,
                                                            (r * n_blocks + b) * 8, ((r + 1) * n_blocks + b) * 8)
                        at = b * n_lanes + g * LANES
                        if offset != 0:
                            correction = load16(qsum_flat, at) * offset
                            isum0, isum1 = isum0 + correction, isum1 + correction
                        d_act, s_act = load16(d_flat, at), load16(s_flat, at)
                        acc0 = _add_block32(qtype, acc0, to_float(isum0), d[r, b], m[r, b], d_act, s_act)
                        acc1 = _add_block32(qtype, acc1, to_float(isum1), d[r + 1, b], m[r + 1, b], d_act, s_act)
                    for row, acc in ((r, acc0), (r + 1, acc1)):
                        store16(result, 0, acc)
                        for lane in range(LANES):
                            if row < rows and g * LANES + lane < out.shape[0]:
                                out[g * LANES + lane, n0 + row] = result[lane]
        return out

    return matmul_lanes_32_vnni


def _lanes_32(qtype: int):
    block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)][1]

    @njit(cache=True, parallel=True)
    def matmul_lanes_32(w, a_t, d_t, s_t, qsum_t, out):
        """out (T, N) = w (N rows of 32-value blocks) times activations a_t (K, lanes) int8.

        d_t, s_t, qsum_t (K/32, lanes): the activation blocks' float16 scale, Q8_1 sum and integer
        sum. Lanes past T are padding.
        """
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
                    d, m, zero = _decode_block32(qtype, w[n0 + r], b * block_bytes, u)
                    lo, hi = _weights16(u, 0, 1), _weights16(u, 16, 1)
                    # exact integer sums, in a loop of their own so that LLVM gives the int16 ones
                    # 32 lanes per instruction (|u| <= 16, |a| <= 127: 32 4-bit or 16 5-bit values fit)
                    if qtype == Q8_0:
                        for t in range(n_lanes):
                            part_32[t] = _dot16(lo, a_t, k0, 1, t) + _dot16(hi, a_t, k0 + 16, 1, t)
                    elif qtype == Q5_0 or qtype == Q5_1:
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
                        elif qtype == Q5_0 or qtype == Q5_1:
                            isum = np.int32(part_lo[t]) + np.int32(part_hi[t])
                        else:
                            isum = np.int32(part_lo[t])
                        isum = np.int32(isum + zero * qsum_t[b, t])
                        acc_r[t] = _add_block32(qtype, acc_r[t], np.float32(isum), d, m, d_t[b, t], s_t[b, t])
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


def _rows_32(qtype: int):
    block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)][1]
    # the unsigned weights' offset: ggml's sum is sum(q * a) + offset * sum(a)
    offset = -8 if qtype == Q4_0 else (-16 if qtype == Q5_0 else 0)

    @njit(cache=True, parallel=True)
    def matmul_rows_32(w, a, d, s, qsum, out, sixteen):
        """out (T, N) = w (N rows of 32-value blocks) times activations a (T, K) int8, row by row.

        d, s, qsum (T, K/32) as for the lanes kernel; the same numbers, for small T.
        """
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
                    sumf = _add_block32(qtype, sumf, np.float32(isum), load_f16(row, off), m, d[t, b], s[t, b])
                out[t, n] = sumf
        return out

    return matmul_rows_32


# ---------------------------------------------------------------- K-quant super-blocks
# 256 values in 8 sub-blocks of 32 (Q6_K: 16 of 16), ggml-common.h:
#   Q4_K, 144 bytes: f16 d | f16 dmin | 12 bytes of 6-bit scales and mins | 128 bytes of 4-bit q
#     q bytes 32c..32c+31 hold sub-block 2c (low nibbles) and 2c+1 (high); value = d*sc*q - dmin*m
#   Q5_K, 176 bytes: as Q4_K with 32 bytes qh after the scales: bit s of qh[i] is the 5th bit of
#     value i of sub-block s
#   Q6_K, 210 bytes: 128 bytes ql | 64 bytes qh | 16 int8 scales | f16 d; value = d*sc*(q - 32)
#     each half of 128 values: ql[i] low/high nibble and qh[i] bits 0-1/4-5 make values i and
#     i + 64, ql[i + 32] and qh[i] bits 2-3/6-7 make values i + 32 and i + 96
# ggml's reference dot keeps 8 int32 lanes per super-block (value e goes to lane e % 8) and 8 float
# sums per row, added together only at the end, so the lanes are kept here too.


@njit(inline="always")
def _scale_min_k4(j, scales, off):
    """Sub-block j's 6-bit scale and min from Q4_K/Q5_K's 12 packed bytes (get_scale_min_k4)."""
    if j < 4:
        return np.int32(scales[off + j] & 63), np.int32(scales[off + j + 4] & 63)
    sc = (scales[off + j + 4] & 15) | ((scales[off + j - 4] >> 6) << 4)
    mn = (scales[off + j + 4] >> 4) | ((scales[off + j] >> 6) << 4)
    return np.int32(sc), np.int32(mn)


@njit(inline="always")
def _decode_superblock(qtype, row, off, u, mins, sixteen):
    """Write a super-block's 256 integers times their sub-block scale into u (int16) and the
    sub-block minimums into mins (int32, 8); return (d, dmin).

    `sixteen` is 16, passed at run time so that LLVM vectorises the loops over the values.
    """
    if qtype == Q6_K:
        for half in range(2):
            ql, qh, e0 = off + 64 * half, off + 128 + 32 * half, 128 * half
            for i0 in range(0, 32, 16):  # 16 values share a scale
                sc0 = np.int32(np.int8(row[off + 192 + (e0 + i0) // 16]))
                sc1 = np.int32(np.int8(row[off + 192 + (e0 + 32 + i0) // 16]))
                sc2 = np.int32(np.int8(row[off + 192 + (e0 + 64 + i0) // 16]))
                sc3 = np.int32(np.int8(row[off + 192 + (e0 + 96 + i0) // 16]))
                for i in range(i0, i0 + sixteen):
                    h = np.int32(row[qh + i])
                    lo, lo2 = np.int32(row[ql + i]), np.int32(row[ql + 32 + i])
                    u[e0 + i] = sc0 * (((lo & 15) | ((h & 3) << 4)) - 32)
                    u[e0 + 32 + i] = sc1 * (((lo2 & 15) | (((h >> 2) & 3) << 4)) - 32)
                    u[e0 + 64 + i] = sc2 * (((lo >> 4) | (((h >> 4) & 3) << 4)) - 32)
                    u[e0 + 96 + i] = sc3 * (((lo2 >> 4) | (((h >> 6) & 3) << 4)) - 32)
        for j in range(8):
            mins[j] = 0
        return load_f16(row, off + 208), np.float32(0.0)
    qs = off + 16 if qtype == Q4_K else off + 48
    for s in range(8):
        sc, mn = _scale_min_k4(s, row, off + 4)
        mins[s] = mn
        byte0 = qs + 32 * (s // 2)
        shift = 4 * (s % 2)
        for i in range(2 * sixteen):
            q = (np.int32(row[byte0 + i]) >> shift) & 15
            if qtype == Q5_K:
                q += ((np.int32(row[off + 16 + i]) >> s) & 1) << 4
            u[32 * s + i] = sc * q
    return load_f16(row, off), load_f16(row, off + 2)


def _lanes_k(qtype: int):
    block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)][1]

    @njit(cache=True, parallel=True)
    def matmul_lanes_k(w, a_t, d_t, sum32_t, out, sixteen):
        """out (T, N) = w (N rows of K-quant super-blocks) times Q8_K activations a_t (K, lanes) int8.

        d_t (K/256, lanes): the activation blocks' float32 scales; sum32_t (K/32, lanes): the
        integer sum of each 32 activations (ggml's bsums, two by two). Lanes past T are padding.
        """
        n_out = w.shape[0]
        k, n_lanes = a_t.shape
        for tile in prange((n_out + TILE_ROWS - 1) // TILE_ROWS):
            n0 = tile * TILE_ROWS
            rows = min(TILE_ROWS, n_out - n0)
            u = np.empty((TILE_ROWS, 256), np.int16)
            mins = np.empty((TILE_ROWS, 8), np.int32)
            d = np.empty(TILE_ROWS, np.float32)
            dmin = np.empty(TILE_ROWS, np.float32)
            lane_sum = np.empty(n_lanes, np.int32)
            sums = np.zeros((TILE_ROWS, 8, n_lanes), np.float32)  # ggml's sums[8]
            sumf = np.zeros((TILE_ROWS, n_lanes), np.float32)  # ggml's sumf
            for sb in range(k // 256):
                k0 = sb * 256
                for r in range(rows):
                    d[r], dmin[r] = _decode_superblock(qtype, w[n0 + r], sb * block_bytes, u[r], mins[r], sixteen)
                for lane in range(8):  # the lane's 32 activation rows stay in L1 for the tile's rows
                    for r in range(rows):
                        lo, hi = _weights16(u[r], lane, 8), _weights16(u[r], lane + 128, 8)
                        for t in range(n_lanes):
                            lane_sum[t] = _dot16(lo, a_t, k0 + lane, 8, t) + _dot16(hi, a_t, k0 + 128 + lane, 8, t)
                        sums_l, d_r = sums[r, lane], d[r]
                        for t in range(n_lanes):
                            sums_l[t] += (d_r * d_t[sb, t]) * np.float32(lane_sum[t])
                if qtype != Q6_K:
                    g = sb * 8
                    for r in range(rows):
                        m0, m1, m2, m3, m4, m5, m6, m7 = mins[r, 0], mins[r, 1], mins[r, 2], mins[r, 3], mins[r, 4], mins[r, 5], mins[r, 6], mins[r, 7]
                        sumf_r, dmin_r = sumf[r], dmin[r]
                        for t in range(n_lanes):
                            sum_mins = (m0 * sum32_t[g, t] + m1 * sum32_t[g + 1, t] + m2 * sum32_t[g + 2, t]
                                        + m3 * sum32_t[g + 3, t] + m4 * sum32_t[g + 4, t] + m5 * sum32_t[g + 5, t]
                                        + m6 * sum32_t[g + 6, t] + m7 * sum32_t[g + 7, t])
                            sumf_r[t] -= (dmin_r * d_t[sb, t]) * np.float32(np.int32(sum_mins))
            for r in range(rows):
                for t in range(out.shape[0]):
                    total = sumf[r, t]
                    for lane in range(8):
                        total += sums[r, lane, t]
                    out[t, n0 + r] = total
        return out

    return matmul_lanes_k


def _rows_k(qtype: int):
    block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)][1]

    @njit(cache=True, parallel=True)
    def matmul_rows_k(w, a, d, sum32, out, sixteen):
        """out (T, N) = w (N rows of K-quant super-blocks) times Q8_K activations a (T, K), row by row.

        d (T, K/256), sum32 (T, K/32) as for the lanes kernel; the same numbers, for small T.
        `sixteen` is 16, passed at run time so that LLVM vectorises the loops over a super-block.
        """
        n_out = w.shape[0]
        n_tok, k = a.shape
        for n in prange(n_out):
            row = w[n]
            u = np.empty(256, np.int16)
            mins = np.empty(8, np.int32)
            prod = np.empty(256, np.int32)
            sums = np.zeros((n_tok, 8), np.float32)
            sumf = np.zeros(n_tok, np.float32)
            for sb in range(k // 256):
                d_w, dmin = _decode_superblock(qtype, row, sb * block_bytes, u, mins, sixteen)
                k0 = sb * 256
                for t in range(n_tok):
                    a_t = a[t]
                    for e in range(16 * sixteen):
                        prod[e] = np.int32(u[e]) * np.int32(a_t[k0 + e])
                    half = 8 * sixteen
                    while half >= 8:  # fold to ggml's 8 lanes: value e goes to lane e % 8
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

    return matmul_rows_k


# ---------------------------------------------------------------- per type


class Kernels:
    """The loop shapes compiled for one weight type: lanes(...) for many activation rows, rows(...)
    for few, and lanes_vnni(...) (32-value block types, CPUs with AVX512-VNNI; else None)."""

    def __init__(self, qtype: int):
        block32 = qtype in BLOCK32_TYPES
        self.lanes = _lanes_32(qtype) if block32 else _lanes_k(qtype)
        self.rows = _rows_32(qtype) if block32 else _rows_k(qtype)
        self.lanes_vnni = _lanes_32_vnni(qtype) if block32 and vnni.AVAILABLE else None


_KERNELS: dict[int, Kernels] = {}


def kernels_for(qtype: int) -> Kernels:
    """The kernels of one weight type, made on first use (numba compiles or loads them from its cache on first call)."""
    if qtype not in _KERNELS:
        _KERNELS[qtype] = Kernels(qtype)
    return _KERNELS[qtype]
