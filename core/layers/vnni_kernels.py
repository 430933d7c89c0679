"""The AVX512-VNNI lanes kernel: the same numbers as quant_kernels.py's portable one (exact integer
sums, ggml's float steps), faster on the avx512-vnni tier (cpu.py), for the weight types that are not
repacked into tiles there (the K-quants).

lanes_k (many activation rows): a micro-kernel in the C sense, a few weight rows times
16 activation rows ("lanes", one 512-bit register), the sums kept in registers (simd.py's
vector values) over a chunk of K, K walked in chunks so that a lane group's activations stay
in L1, each tile of weight rows decoded once for every lane group.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from numba import prange

from . import int8_dots
from .cache_key import HELPERS, cached_variant
from .quant_blocks import Q6_K, decode_superblock
from .simd import LANES, load16, store16, to_float

TILE_ROWS = 16  # weight rows decoded together and shared by every lane group
CHUNK_VALUES = 1024  # K is walked in chunks: a lane group's chunk of activations stays in L1


def lanes_k(qtype: int):
    block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)][1]
    helpers = HELPERS
    has_mins = qtype != Q6_K

    @cached_variant(GGMLQuantizationType(qtype).name, parallel=True)
    def matmul_lanes_k_vnni(w, a_groups, d_t, sum32_t, out, sixteen):
        """out (T, N) = w (N rows of K-quant super-blocks) times Q8_K activations, with vpdpwssd.

        a_groups (lanes / 16, K / 2, 16) int32: activation pairs of ggml's 8 lanes (see
        activations.quantize_q8_k_pair_groups). d_t (K / 256, lanes), sum32_t (K / 32, lanes).
        One weight row times 16 lanes at a time, ggml's 8 lane sums and sumf in registers.
        """
        helpers  # in numba's cache key: see cache_key.py
        n_out = w.shape[0]
        n_groups, n_pairs, _ = a_groups.shape
        n_super, n_lanes = n_pairs // 128, n_groups * LANES
        a_flat = a_groups.reshape(n_groups * n_pairs * LANES)
        d_flat, s32_flat = d_t.reshape(n_super * n_lanes), sum32_t.reshape(n_super * 8 * n_lanes)
        for tile in prange((n_out + TILE_ROWS - 1) // TILE_ROWS):
            n0 = tile * TILE_ROWS
            rows = min(TILE_ROWS, n_out - n0)
            # the tile's weights decoded once: scale-folded int16 values paired as the activations are
            pairs = np.empty(TILE_ROWS * n_super * 128, np.int32)
            d = np.empty((TILE_ROWS, n_super), np.float32)
            dmin = np.empty((TILE_ROWS, n_super), np.float32)
            mins = np.empty((TILE_ROWS, n_super, 8), np.int32)
            u = np.empty(256, np.int16)
            for r in range(rows):
                for sb in range(n_super):
                    d[r, sb], dmin[r, sb] = decode_superblock(qtype, w[n0 + r], sb * block_bytes, u, mins[r, sb], sixteen)
                    at = (r * n_super + sb) * 128
                    for lane in range(8):
                        for j in range(16):
                            e = lane + 16 * j
                            pairs[at + 16 * lane + j] = np.int32(np.uint32(np.uint16(u[e])) | (np.uint32(np.uint16(u[e + 8])) << 16))
            sums = np.zeros((TILE_ROWS, 9, LANES), np.float32)  # ggml's sums[8] and sumf, between chunks of K
            chunk = CHUNK_VALUES // 512
            for g in range(n_groups):
                sums[:] = 0
                for sb0 in range(0, n_super, chunk):
                    for r in range(rows):
                        s = sums[r]
                        s0, s1, s2, s3 = load16(s[0], 0), load16(s[1], 0), load16(s[2], 0), load16(s[3], 0)
                        s4, s5, s6, s7, sumf = load16(s[4], 0), load16(s[5], 0), load16(s[6], 0), load16(s[7], 0), load16(s[8], 0)
                        for sb in range(sb0, min(sb0 + chunk, n_super)):
                            l0, l1, l2, l3, l4, l5, l6, l7 = int8_dots.dot_superblock_lanes8(
                                a_flat, (g * n_pairs + 128 * sb) * LANES, pairs, (r * n_super + sb) * 128)
                            d_act = load16(d_flat, sb * n_lanes + g * LANES)
                            scale = d[r, sb] * d_act  # ggml: sums[l] += d * aux32[l], d = x.d * y.d
                            s0, s1, s2, s3 = s0 + scale * to_float(l0), s1 + scale * to_float(l1), s2 + scale * to_float(l2), s3 + scale * to_float(l3)
                            s4, s5, s6, s7 = s4 + scale * to_float(l4), s5 + scale * to_float(l5), s6 + scale * to_float(l6), s7 + scale * to_float(l7)
                            if has_mins:  # ggml: sumf -= dmin * sum(bsums * mins)
                                at = 8 * sb * n_lanes + g * LANES
                                sum_mins = load16(s32_flat, at) * mins[r, sb, 0]
                                for j in range(1, 8):
                                    sum_mins = sum_mins + load16(s32_flat, at + j * n_lanes) * mins[r, sb, j]
                                sumf = sumf - (dmin[r, sb] * d_act) * to_float(sum_mins)
                        store16(s[0], 0, s0), store16(s[1], 0, s1), store16(s[2], 0, s2), store16(s[3], 0, s3)
                        store16(s[4], 0, s4), store16(s[5], 0, s5), store16(s[6], 0, s6), store16(s[7], 0, s7)
                        store16(s[8], 0, sumf)
                result = np.empty(LANES, np.float32)
                for r in range(rows):
                    s = sums[r]
                    total = load16(s[8], 0)  # ggml: sumf += sums[l], l = 0..7
                    for j in range(8):
                        total = total + load16(s[j], 0)
                    store16(result, 0, total)
                    for lane in range(LANES):
                        if g * LANES + lane < out.shape[0]:
                            out[g * LANES + lane, n0 + r] = result[lane]
        return out

    return matmul_lanes_k_vnni
