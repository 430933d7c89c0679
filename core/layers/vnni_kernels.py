"""The AVX512-VNNI kernels: the same numbers as quant_kernels.py's portable ones (exact integer
sums, ggml's float steps), faster where the CPU has AVX512-VNNI (vnni.AVAILABLE).

- lanes_32, lanes_k (many activation rows): micro-kernels in the C sense, a few weight rows times
  16 activation rows ("lanes", one 512-bit register), the sums kept in registers (simd.py's
  vector values) over a chunk of K, K walked in chunks so that a lane group's activations stay
  in L1, each tile of weight rows decoded once for every lane group.
- tiles_32 (Q4_0/Q4_1/Q8_0 repacked into 16-row tiles at load, any number of activation rows): one weight
  vector serves 8 activation rows, each activation quad broadcast from memory; 1.5-2x lanes_32's speed.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from numba import njit, prange

from . import vnni
from .cache_key import HELPERS, cached_variant
from .halfs import load_f16
from .quant_blocks import Q4_1, Q5_1, Q6_K, Q8_0, add_block32, decode_superblock, quads_offset, weight_quads
from .simd import LANES, load16, load16_f16, store16, to_float, zeros16
from .tiles import TILE_TOKENS, TILE_TYPES, quant_bytes
from .tiles import TILE_ROWS as REPACKED_TILE_ROWS

TILE_ROWS = 16  # weight rows decoded together and shared by every lane group
CHUNK_VALUES = 1024  # K is walked in chunks: a lane group's chunk of activations stays in L1


def lanes_32(qtype: int):
    block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)][1]
    helpers = HELPERS
    has_min = qtype == Q4_1 or qtype == Q5_1
    offset = quads_offset(qtype)

    @cached_variant(GGMLQuantizationType(qtype).name, parallel=True)
    def matmul_lanes_32_vnni(w, a_groups, d_t, s_t, qsum_t, out):
        """out (T, N) = w (N rows of 32-value blocks) times activations quantized in 32-value blocks.

        a_groups (lanes / 16, K / 4, 16) uint32: lane l of group g's 4 activations 4q..4q+3 at
        [g, q, l]. d_t, s_t, qsum_t (K / 32, lanes).
        Two weight rows times 16 lanes at a time; each activation load serves both rows.
        """
        helpers  # in numba's cache key: see cache_key.py
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
                     quads[at + 4], quads[at + 5], quads[at + 6], quads[at + 7]) = weight_quads(qtype, row, off)
                    d[r, b] = load_f16(row, off)
                    m[r, b] = load_f16(row, off + 2) if has_min else np.float32(0.0)
            acc = np.zeros((TILE_ROWS, LANES), np.float32)  # sums between chunks of K
            chunk = CHUNK_VALUES // 32
            for g in range(n_groups):
                acc[:] = 0
                for b0 in range(0, n_blocks, chunk):
                    for r in range(0, rows, 2):
                        acc0, acc1 = load16(acc[r], 0), load16(acc[r + 1], 0)
                        for b in range(b0, min(b0 + chunk, n_blocks)):
                            isum0, isum1 = vnni.dot_block_rows2(a_flat, (g * n_quads + 8 * b) * LANES, quads,
                                                                (r * n_blocks + b) * 8, ((r + 1) * n_blocks + b) * 8)
                            at = b * n_lanes + g * LANES
                            if offset != 0:
                                correction = load16(qsum_flat, at) * offset
                                isum0, isum1 = isum0 + correction, isum1 + correction
                            d_act, s_act = load16(d_flat, at), load16(s_flat, at)
                            acc0 = add_block32(qtype, acc0, to_float(isum0), d[r, b], m[r, b], d_act, s_act)
                            acc1 = add_block32(qtype, acc1, to_float(isum1), d[r + 1, b], m[r + 1, b], d_act, s_act)
                        store16(acc[r], 0, acc0)
                        store16(acc[r + 1], 0, acc1)
                for r in range(rows):
                    for lane in range(LANES):
                        if g * LANES + lane < out.shape[0]:
                            out[g * LANES + lane, n0 + r] = acc[r, lane]
        return out

    return matmul_lanes_32_vnni


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
                            l0, l1, l2, l3, l4, l5, l6, l7 = vnni.dot_superblock_lanes8(
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


def tiles_32(qtype: int):
    """The tile kernel for Q4_0, Q4_1 and Q8_0 weights repacked into 16-row tiles (tiles.py): any number of
    activation rows, the same numbers as the other kernels."""
    if qtype not in TILE_TYPES:
        return None
    has_min = qtype == Q4_1
    offset = quads_offset(qtype)
    block_quants = quant_bytes(qtype)
    helpers = HELPERS

    @cached_variant(GGMLQuantizationType(qtype).name, parallel=True)
    def matmul_tiles_32(quants, scales, mins, a, d, s, qsum, out):
        """out (T, N) = tiles of N rows times activations a (T8, K) int8, row-major, T8 >= T a multiple of 8
        (rows past T zero); d, s, qsum (T8, K / 32). 16 weight rows times 8 activation rows at a time, the
        float sums in 8 registers of 16 lanes (one lane per weight row) over all of K."""
        helpers  # in numba's cache key: see cache_key.py
        n_tok, n_out = out.shape
        k = a.shape[1]
        n_blocks = k // 32
        a_flat = a.reshape(a.size)
        for tile in prange(quants.shape[0]):
            spill = np.empty(LANES, np.float32)
            tile_quants, tile_scales, tile_mins = quants[tile], scales[tile], mins[tile]
            n0 = tile * REPACKED_TILE_ROWS
            for t in range(0, n_tok, TILE_TOKENS):
                zero = zeros16()
                c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = zero
                for b in range(n_blocks):
                    if qtype == Q8_0:
                        i0, i1, i2, i3, i4, i5, i6, i7 = vnni.dot_byte_tile(tile_quants, b * block_quants, a_flat,
                                                                            t * k + 32 * b, k)
                    else:
                        i0, i1, i2, i3, i4, i5, i6, i7 = vnni.dot_nibble_tile(tile_quants, b * block_quants, a_flat,
                                                                              t * k + 32 * b, k)
                    dw = load16_f16(tile_scales, 16 * b)
                    mw = load16_f16(tile_mins, 16 * b) if has_min else zero
                    c0 = add_block32(qtype, c0, to_float(i0 + offset * qsum[t, b]), dw, mw, d[t, b], s[t, b])
                    c1 = add_block32(qtype, c1, to_float(i1 + offset * qsum[t + 1, b]), dw, mw, d[t + 1, b], s[t + 1, b])
                    c2 = add_block32(qtype, c2, to_float(i2 + offset * qsum[t + 2, b]), dw, mw, d[t + 2, b], s[t + 2, b])
                    c3 = add_block32(qtype, c3, to_float(i3 + offset * qsum[t + 3, b]), dw, mw, d[t + 3, b], s[t + 3, b])
                    c4 = add_block32(qtype, c4, to_float(i4 + offset * qsum[t + 4, b]), dw, mw, d[t + 4, b], s[t + 4, b])
                    c5 = add_block32(qtype, c5, to_float(i5 + offset * qsum[t + 5, b]), dw, mw, d[t + 5, b], s[t + 5, b])
                    c6 = add_block32(qtype, c6, to_float(i6 + offset * qsum[t + 6, b]), dw, mw, d[t + 6, b], s[t + 6, b])
                    c7 = add_block32(qtype, c7, to_float(i7 + offset * qsum[t + 7, b]), dw, mw, d[t + 7, b], s[t + 7, b])
                _store_tile_row(out, t, n0, c0, spill)
                _store_tile_row(out, t + 1, n0, c1, spill)
                _store_tile_row(out, t + 2, n0, c2, spill)
                _store_tile_row(out, t + 3, n0, c3, spill)
                _store_tile_row(out, t + 4, n0, c4, spill)
                _store_tile_row(out, t + 5, n0, c5, spill)
                _store_tile_row(out, t + 6, n0, c6, spill)
                _store_tile_row(out, t + 7, n0, c7, spill)
        return out

    return matmul_tiles_32


@njit(inline="always")
def _store_tile_row(out, t, n0, sums, spill):
    """out[t, n0:n0 + 16] = sums, for the rows and columns out has (padding rows and a short last tile aside)."""
    if t >= out.shape[0]:
        return
    if n0 + LANES <= out.shape[1]:
        store16(out[t], n0, sums)
        return
    store16(spill, 0, sums)
    for j in range(out.shape[1] - n0):
        out[t, n0 + j] = spill[j]
