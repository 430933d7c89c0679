"""GGUF weight blocks as ggml stores them, decoded for the kernels, and ggml's float step per block.

Every kernel takes a block's integers from here and applies add_block32 (32-value blocks) or the
K-quant steps spelled out in its own loop, so all of them compute the same numbers.
"""

from __future__ import annotations

import math

import numpy as np
from gguf import GGMLQuantizationType
from numba import njit

from miro.core.kernels.halfs import load_f16

Q4_0 = int(GGMLQuantizationType.Q4_0)
Q4_1 = int(GGMLQuantizationType.Q4_1)
Q5_0 = int(GGMLQuantizationType.Q5_0)
Q5_1 = int(GGMLQuantizationType.Q5_1)
Q8_0 = int(GGMLQuantizationType.Q8_0)
MXFP4 = int(GGMLQuantizationType.MXFP4)
Q4_K = int(GGMLQuantizationType.Q4_K)
Q5_K = int(GGMLQuantizationType.Q5_K)
Q6_K = int(GGMLQuantizationType.Q6_K)
# not a GGML type: Q6_K's values one byte each, q - 32, in the grouped expert kernel's tiles on the vpmaddubsw tiers
# (superblock_tiles.expert_byte_values); the kernels' layout id, beside the types they take
Q6_K_BYTES = 1000 + Q6_K

BLOCK32_TYPES = (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4)
HAS_MIN = (Q4_1, Q5_1)  # the 32-value blocks that carry a float16 m beside d
HAS_FIFTH_BITS = (Q5_0, Q5_1)  # and those whose values have a 5th bit, in qh
SUPERBLOCK_TYPES = (Q4_K, Q5_K, Q6_K)


# ---------------------------------------------------------------- 32-value blocks
# Block layouts (ggml-common.h); "nibbles" are 16 bytes whose byte j holds value j in its low
# 4 bits and value j + 16 in its high 4 bits; qh is a little-endian uint32 whose bit j is the
# 5th bit of value j.
#   Q4_0, 18 bytes: f16 d | nibbles                 value = d * (q - 8)
#   Q4_1, 20 bytes: f16 d | f16 m | nibbles         value = d * q + m
#   Q5_0, 22 bytes: f16 d | qh | nibbles            value = d * (q - 16)
#   Q5_1, 24 bytes: f16 d | f16 m | qh | nibbles    value = d * q + m
#   Q8_0, 34 bytes: f16 d | 32 int8                 value = d * q
#   MXFP4, 17 bytes: u8 e | nibbles                 value = 2^(e - 128) * KVALUES_MXFP4[q]
# MXFP4's e is an E8M0 exponent; its 4-bit codes are E2M1 values, doubled to integers (ggml's kvalues_mxfp4) and
# the scale halved to match, so its integer dot is exact like the others' (ggml-common.h, ggml-impl.h).
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)
MXFP4_BIAS = 12  # the tile kernels look the codes up as KVALUES_MXFP4 + 12 (0..24), unsigned for the int8 dots


@njit(inline="always")
def e8m0_half(e):
    """ggml's GGML_E8M0_TO_FP32_HALF: 2^(e - 128) as float32, exact for every byte (2^-128 and 2^-127 are
    denormals)."""
    return np.float32(math.ldexp(1.0, np.int64(e) - 128))


@njit(inline="always")
def decode_block32(qtype, row, off, u):
    """Write one block's 32 integers, centred on 0, into u (int16); return (d, m, offset).

    ggml's integer sum of the block against activations a is sum(u * a) + offset * sum(a): the
    centring keeps the 4- and 5-bit sums within int16, the offset gives back ggml's sum exactly. MXFP4: its
    table's values (|u| <= 12) and d = 2^(e - 128).
    """
    m = np.float32(0.0)
    offset = 0
    if qtype == MXFP4:
        for j in range(16):
            byte = np.int32(row[off + 1 + j])
            u[j] = KVALUES_MXFP4[byte & 15]
            u[j + 16] = KVALUES_MXFP4[byte >> 4]
        return e8m0_half(row[off]), m, offset
    d = load_f16(row, off)
    if qtype == Q8_0:
        for j in range(32):
            u[j] = np.int8(row[off + 2 + j])
        return d, m, offset
    if qtype == Q4_0 or qtype == Q4_1:
        centre = 8
        nibbles = off + 2 if qtype == Q4_0 else off + 4
        high_bits = np.uint32(0)
    else:
        centre = 16
        qh = off + 2 if qtype == Q5_0 else off + 4
        nibbles = qh + 4
        high_bits = (
            np.uint32(row[qh])
            | (np.uint32(row[qh + 1]) << 8)
            | (np.uint32(row[qh + 2]) << 16)
            | (np.uint32(row[qh + 3]) << 24)
        )
    if qtype == Q4_1 or qtype == Q5_1:
        m = load_f16(row, off + 2)
        offset = centre
    for j in range(16):
        byte = np.int32(row[nibbles + j])
        u[j] = (byte & 15) + (((high_bits >> j) & 1) << 4) - centre
        u[j + 16] = (byte >> 4) + (((high_bits >> (j + 16)) & 1) << 4) - centre
    return d, m, offset


@njit(inline="always")
def add_block32(qtype, acc, isum, d, m, d_act, s_act):
    """acc plus one block's contribution: ggml's float steps, operation for operation.

    isum: ggml's integer sum, as float32 (exact); d, m: the weight block's scale and min;
    d_act, s_act: the activation block's float16 scale and Q8_1 sum. acc, isum, d_act, s_act
    are float32 scalars, or float32x16 for 16 activation rows at once: the same IEEE steps.
    """
    if qtype == Q4_0:
        return acc + (isum * d) * d_act
    if qtype == Q4_1 or qtype == Q5_1:
        return acc + ((d * d_act) * isum + m * s_act)
    return acc + (d * d_act) * isum  # Q5_0, Q8_0, MXFP4 (ggml: d = d_act * 2^(e - 128), the same product)


@njit(inline="always")
def load_u32(row, at):
    return (
        np.uint32(row[at])
        | (np.uint32(row[at + 1]) << 8)
        | (np.uint32(row[at + 2]) << 16)
        | (np.uint32(row[at + 3]) << 24)
    )


def quads_offset(qtype: int) -> int:
    """The offset of ggml's sum over a block's unsigned values as stored (Q8_0's + 128; MXFP4's looked up + 12):
    sum(u * a) + offset * sum(a)."""
    return {Q4_0: -8, Q5_0: -16, Q8_0: -128, MXFP4: -MXFP4_BIAS}.get(qtype, 0)


# ---------------------------------------------------------------- K-quant super-blocks
# 256 values in 8 sub-blocks of 32 (Q6_K: 16 of 16), ggml-common.h:
#   Q4_K, 144 bytes: f16 d | f16 dmin | 12 bytes of 6-bit scales and mins | 128 bytes of 4-bit q
#     q bytes 32c..32c+31 hold sub-block 2c (low nibbles) and 2c+1 (high); value = d*sc*q - dmin*m
#   Q5_K, 176 bytes: as Q4_K with 32 bytes qh after the scales: bit s of qh[i] is the 5th bit of
#     value i of sub-block s
#   Q6_K, 210 bytes: 128 bytes ql | 64 bytes qh | 16 int8 scales | f16 d; value = d*sc*(q - 32)
#     each half of 128 values: ql[i] low/high nibble and qh[i] bits 0-1/4-5 make values i and
#     i + 64, ql[i + 32] and qh[i] bits 2-3/6-7 make values i + 32 and i + 96
# The K-quant kernels follow ggml's x86 repack kernel (ggml_gemm_q4_K_8x8_q8_K): a super-block's products,
# each times its sub-block's scale, summed exactly into one integer per row, then one float step.


@njit(inline="always")
def unpack_k4(low, high, top):
    """ggml's get_scale_min_k4 for sub-blocks q and q + 4 at once (q < 4), from bytes q, q + 4 and q + 8 of
    Q4_K/Q5_K's 12 packed bytes: (scale q, min q, scale q + 4, min q + 4). Plain arithmetic on its arguments, so a
    loop over a tile's 16 rows of those bytes vectorizes (superblock_tiles.k4_tile_pairs)."""
    return (low & 63, high & 63, (top & 15) | ((low >> 6) << 4), (top >> 4) | ((high >> 6) << 4))


@njit(inline="always")
def scale_min_k4(j, scales, off):
    """Sub-block j's 6-bit scale and min from Q4_K/Q5_K's 12 packed bytes at scales[off:]."""
    q = j % 4
    sc, mn, sc_high, mn_high = unpack_k4(scales[off + q], scales[off + q + 4], scales[off + q + 8])
    if j < 4:
        return np.int32(sc), np.int32(mn)
    return np.int32(sc_high), np.int32(mn_high)


@njit(inline="always")
def decode_superblock(qtype, row, off, u, mins, sixteen):
    """Write a super-block's 256 integers times their sub-block scale into u (int16) and the
    sub-block minimums into mins (int32, 8); return (d, dmin).

    `sixteen` is 16, passed at run time so that LLVM vectorises the loops over the values.
    """
    if qtype == Q6_K:
        for half in range(2):
            ql, qh, e0 = off + 64 * half, off + 128 + 32 * half, 128 * half
            for quarter in range(4):  # values e0 + 32 quarter + i, i < 32: one simple loop each
                low_bits = ql + 32 * (quarter % 2)
                shift = 4 * (quarter // 2)
                for i0 in range(0, 32, 16):  # 16 values share a scale
                    e = e0 + 32 * quarter + i0
                    sc = np.int32(np.int8(row[off + 192 + e // 16]))
                    for i in range(sixteen):
                        q = ((np.int32(row[low_bits + i0 + i]) >> shift) & 15) | (
                            ((np.int32(row[qh + i0 + i]) >> (2 * quarter)) & 3) << 4
                        )
                        u[e + i] = sc * (q - 32)
        for j in range(8):
            mins[j] = 0
        return load_f16(row, off + 208), np.float32(0.0)
    qs = off + 16 if qtype == Q4_K else off + 48
    for s in range(8):
        sc, mn = scale_min_k4(s, row, off + 4)
        mins[s] = mn
        byte0 = qs + 32 * (s // 2)
        shift = 4 * (s % 2)
        for i in range(2 * sixteen):
            q = (np.int32(row[byte0 + i]) >> shift) & 15
            if qtype == Q5_K:
                q += ((np.int32(row[off + 16 + i]) >> s) & 1) << 4
            u[32 * s + i] = sc * q
    return load_f16(row, off), load_f16(row, off + 2)
