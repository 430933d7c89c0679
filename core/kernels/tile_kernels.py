"""The tile kernel: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and MXFP4 weights repacked into 16-row tiles (tiles.py) times 8-bit
activations, any number of activation rows, on every CPU tier with int8 dot products (cpu.py).

One decoded weight vector serves several activation rows, each activation quad broadcast to every weight
row; the float sums sit in registers of 16 lanes, one lane per weight row, over all of K. The number of
activation rows per pass is set by the tier's registers:

- 512-bit tiers (32 zmm): 8 rows, 8 sums of 16 lanes, the 8 int32 dots beside them;
- 256-bit tiers (16 ymm): 2 rows, each 16-lane sum two ymm, its int16 or int32 dots two more; 512-bit tiers
  below 8 rows too, where padding to 8 would multiply the work.

Integer sums are exact; the float steps are add_block32's, block after block, so every tier and every row
count gives the bits of quant_kernels.py's portable kernels.

`tiles_k` is the same for the K-quants' tiles (superblock_tiles.py): 16 activation rows a pass (Q5_K's 8 on
512-bit tiers; the rows' tile_tokens in weight_types.py), each super-block's exact integer sum per row and token built in int32 and given one
float step, as ggml's x86 repack kernel does. A tile's scale pairs and mins are unpacked once per call, not per
pass.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType
from numba import njit, prange
import numpy as np

from miro.core.kernels.cache_key import HELPERS, cached_variant
from miro.core.kernels.cpu import Tier
from miro.core.kernels.int8_dots import (
    lanes_per_call,
    mins_dot,
    scale_pairs16,
    superblock_bias,
    superblock_tile_sum,
    tile_dot,
    tile_signed_bytes,
)
from miro.core.kernels.quant_blocks import (
    BLOCK32_TYPES,
    HAS_MIN,
    MXFP4,
    Q6_K,
    SUPERBLOCK_TYPES,
    add_block32,
    quads_offset,
    unpack_k4,
)
from miro.core.kernels.simd import LANES, load16, load16_e8m0, load16_f16, store16, to_float, zeros16
from miro.core.kernels.superblock_tiles import LANE_BYTES
from miro.core.kernels.tiles import TILE_ROWS, quant_bytes


def tile_offset(qtype: int, tier: Tier) -> int:
    """What the tile's integer sum needs added, times the activations' sum, to be ggml's sum."""
    return 0 if tile_signed_bytes(qtype, tier.has_vnni) else quads_offset(qtype)


def tiles_32(qtype: int, tier: Tier, tokens: int):
    """The tile kernel for one weight type on one tier, `tokens` (8 or 2) activation rows per pass:
    kernel(quants, scales, mins, a, d, s, qsum, out)."""
    if qtype not in BLOCK32_TYPES or not tier.int8_dot:
        return None
    if tokens == 8:
        return _tiles_x8(qtype, tier)
    return _tiles_x2(qtype, tier)


def _constants(qtype: int, tier: Tier) -> tuple[bool, int, int, int, bool]:
    """What a tile kernel bakes in: Q4_1's or Q5_1's mins, the sums' offset, a block's quant bytes, vpdpbusd or
    not, and whether the scales are MXFP4's E8M0 bytes (else float16)."""
    return qtype in HAS_MIN, tile_offset(qtype, tier), quant_bytes(qtype), int(tier.has_vnni), qtype == MXFP4


def _tiles_x8(qtype: int, tier: Tier):
    has_min, offset, block_quants, vnni, e8m0 = _constants(qtype, tier)
    helpers = HELPERS

    @cached_variant(f"{GGMLQuantizationType(qtype).name}_{tier.name.replace('-', '_')}", parallel=True)
    def matmul_tiles_x8(quants, scales, mins, a, d, s, qsum, out):
        """out (T, N) = tiles of N rows times activations a (T8, K) int8, row-major, T8 >= T a multiple of 8
        (rows past T zero); d, s, qsum (T8, K / 32). 16 weight rows times 8 activation rows at a time."""
        helpers  # in numba's cache key: see cache_key.py
        n_tok, n_out = out.shape
        k = a.shape[1]
        n_blocks = k // 32
        a_flat = a.reshape(a.size)
        for tile in prange(quants.shape[0]):
            spill = np.empty(LANES, np.float32)
            tile_quants, tile_scales, tile_mins = quants[tile], scales[tile], mins[tile]
            n0 = tile * TILE_ROWS
            for t in range(0, n_tok, 8):
                zero = zeros16()
                c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = zero
                for b in range(n_blocks):
                    i0, i1, i2, i3, i4, i5, i6, i7 = tile_dot(tile_quants, b * block_quants, a_flat, t * k + 32 * b, k,
                                                              512, vnni, qtype, 8)
                    dw = load16_e8m0(tile_scales, 16 * b) if e8m0 else load16_f16(tile_scales, 16 * b)
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

    return matmul_tiles_x8


def _tiles_x2(qtype: int, tier: Tier):
    has_min, offset, block_quants, vnni, e8m0 = _constants(qtype, tier)
    bits = 512 if tier.vector_bits == 512 else 256
    helpers = HELPERS

    @cached_variant(f"{GGMLQuantizationType(qtype).name}_{tier.name.replace('-', '_')}", parallel=True)
    def matmul_tiles_x2(quants, scales, mins, a, d, s, qsum, out):
        """out (T, N) = tiles of N rows times activations a (T2, K) int8, row-major, T2 >= T a multiple of 2
        (a row past T zero); d, s, qsum (T2, K / 32). 16 weight rows times 2 activation rows at a time."""
        helpers  # in numba's cache key: see cache_key.py
        n_tok, n_out = out.shape
        k = a.shape[1]
        n_blocks = k // 32
        a_flat = a.reshape(a.size)
        for tile in prange(quants.shape[0]):
            spill = np.empty(LANES, np.float32)
            tile_quants, tile_scales, tile_mins = quants[tile], scales[tile], mins[tile]
            n0 = tile * TILE_ROWS
            for t in range(0, n_tok, 2):
                zero = zeros16()
                c0 = c1 = zero
                for b in range(n_blocks):
                    i0, i1 = tile_dot(tile_quants, b * block_quants, a_flat, t * k + 32 * b, k, bits, vnni, qtype, 2)
                    dw = load16_e8m0(tile_scales, 16 * b) if e8m0 else load16_f16(tile_scales, 16 * b)
                    mw = load16_f16(tile_mins, 16 * b) if has_min else zero
                    c0 = add_block32(qtype, c0, to_float(i0 + offset * qsum[t, b]), dw, mw, d[t, b], s[t, b])
                    c1 = add_block32(qtype, c1, to_float(i1 + offset * qsum[t + 1, b]), dw, mw, d[t + 1, b], s[t + 1, b])
                _store_tile_row(out, t, n0, c0, spill)
                _store_tile_row(out, t + 1, n0, c1, spill)
        return out

    return matmul_tiles_x2


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


# ---------------------------------------------------------------- K-quant super-blocks


def tiles_k(qtype: int, tier: Tier, tokens: int):
    """The K-quant tile kernel (superblock_tiles.py) for one weight type on one tier, `tokens` activation rows
    per pass: kernel(quants, scales, mins, sub_scales, a, d, sum32, out)."""
    if qtype not in SUPERBLOCK_TYPES or not tier.int8_dot:
        return None
    bits = 512 if tier.vector_bits == 512 else 256
    vnni = int(tier.has_vnni)
    lane_bytes = LANE_BYTES[qtype]
    has_mins = qtype != Q6_K
    per_call = lanes_per_call(qtype, bits)
    helpers = HELPERS

    @cached_variant(f"{GGMLQuantizationType(qtype).name}_{tier.name.replace('-', '_')}_x{tokens}", parallel=True)
    def matmul_tiles_k(quants, scales, mins, sub_scales, a, d, sum32, out):
        """out (T, N) = tiles of N rows times Q8_K activations a (Tp, K) int8 in quad order
        (activations.quantize_q8_k_quads, biased for Q6_K), Tp >= T a multiple of `tokens` (rows past T zero); d (Tp, K / 256),
        sum32 (Tp, K / 32). A tile of 16 weight rows times `tokens` activation rows at a time. Per row and token,
        as ggml's x86 repack kernel (ggml_gemm_q4_K_8x8_q8_K): each super-block's exact integer sum, sub-block
        scales applied, takes one float step, acc += (d_w * d_a) * sum, the mins another,
        acc_mins += (dmin * d_a) * sum(mins * bsums), and out = acc - acc_mins."""
        helpers  # in numba's cache key: see cache_key.py
        n_tok, n_out = out.shape
        k = a.shape[1]
        n_super = k // 256
        n_tiles, tile_bytes = quants.shape
        flat_quants = quants.reshape(quants.size)
        a_flat = a.reshape(a.size)
        # the activations' sums of sub-blocks 2 j and 2 j + 1 as one int16 pair (|sum| <= 32 x 127), for vpmaddwd
        sum_pairs = np.empty((a.shape[0], k // 64), np.int32)
        for t in range(a.shape[0] if has_mins else 0):
            for j in range(k // 64):
                sum_pairs[t, j] = (sum32[t, 2 * j] & 0xFFFF) | (sum32[t, 2 * j + 1] << 16)
        for tile in prange(n_tiles):
            # per super-block, once per call: the int16 scale pairs of its quads (Q4_K, Q5_K: 4 of 8; Q6_K: 8),
            # [super-block][quad][row], and the mins of sub-block pairs [super-block][pair][row]
            pairs = np.empty(n_super * 8 * TILE_ROWS, np.int32)
            min_pairs = np.empty(n_super * 4 * TILE_ROWS if has_mins else 0, np.int32)
            biases = np.empty(0 if has_mins else n_super * TILE_ROWS, np.int32)  # Q6_K: per super-block and row
            unpacked = np.empty(16 * TILE_ROWS, np.uint8)  # Q4_K, Q5_K: one super-block's 8 scales and 8 mins per row
            tile_sub_scales = sub_scales[tile]
            for sb in range(n_super):
                at = sb * 8 * TILE_ROWS
                if has_mins:
                    _unpack_k4_scales(tile_sub_scales, sb, unpacked)
                    _scale_pairs(qtype, unpacked, 0, pairs[at:])
                    for j in range(4):  # the mins of sub-blocks 2 j and 2 j + 1 as int16 pairs
                        low = (8 + 2 * j) * TILE_ROWS
                        store16(min_pairs, (sb * 4 + j) * TILE_ROWS, scale_pairs16(unpacked, low, low + TILE_ROWS, False))
                else:
                    _scale_pairs(qtype, tile_sub_scales, sb, pairs[at:])
                    store16(biases, sb * TILE_ROWS,
                            superblock_bias(flat_quants, tile * tile_bytes + 8 * sb * lane_bytes, pairs, at, bits, vnni))
            spill = np.empty(LANES, np.float32)
            isums = np.empty(tokens * TILE_ROWS, np.int32)  # a super-block's integer sums, [token][row]
            acc = np.empty(tokens * TILE_ROWS, np.float32)
            acc_mins = np.empty(tokens * TILE_ROWS, np.float32)
            for t0 in range(0, n_tok, tokens):
                acc[:] = 0
                acc_mins[:] = 0
                for sb in range(n_super):
                    isums[:] = 0
                    w_at = tile * tile_bytes + 8 * sb * lane_bytes
                    for c in range(4):  # in the order the tile's bytes lie
                        for lane in range(0, 8, per_call):
                            superblock_tile_sum(flat_quants, w_at, pairs, sb * 8 * TILE_ROWS, a_flat, t0 * k + 256 * sb,
                                                k, isums, c, lane, bits, vnni, qtype, tokens)
                    dw = load16_f16(scales[tile], TILE_ROWS * sb)
                    for t in range(tokens):
                        at = TILE_ROWS * t
                        total = load16(isums, at)
                        if not has_mins:  # what Q6_K's biased activations added
                            total = total - load16(biases, sb * TILE_ROWS)
                        store16(acc, at, load16(acc, at) + (dw * d[t0 + t, sb]) * to_float(total))
                    if has_mins:
                        dmin = load16_f16(mins[tile], TILE_ROWS * sb)
                        for t in range(tokens):
                            sum_mins = mins_dot(min_pairs, sb * 4 * TILE_ROWS, sum_pairs[t0 + t], 4 * sb, bits)
                            at = TILE_ROWS * t
                            store16(acc_mins, at, load16(acc_mins, at) + (dmin * d[t0 + t, sb]) * to_float(sum_mins))
                for t in range(tokens):
                    at = TILE_ROWS * t
                    total = load16(acc, at) - load16(acc_mins, at) if has_mins else load16(acc, at)
                    _store_tile_row(out, t0 + t, tile * TILE_ROWS, total, spill)
        return out

    return matmul_tiles_k


@njit(inline="always")
def _unpack_k4_scales(packed, sb, unpacked):
    """unpacked[16 j + r]: sub-block j's 6-bit scale of row r, unpacked[16 (8 + j) + r] its min, from super-block
    sb's 12 packed bytes per row in the tile (packed[(12 sb + i) * 16 + r]), as ggml's get_scale_min_k4."""
    at = 12 * TILE_ROWS * sb
    to = 0
    for q in range(4):
        for r in range(TILE_ROWS):
            sc, mn, sc_high, mn_high = unpack_k4(packed[at + TILE_ROWS * q + r], packed[at + TILE_ROWS * (q + 4) + r],
                                                 packed[at + TILE_ROWS * (q + 8) + r])
            unpacked[to + TILE_ROWS * q + r] = sc
            unpacked[to + TILE_ROWS * (8 + q) + r] = mn
            unpacked[to + TILE_ROWS * (4 + q) + r] = sc_high
            unpacked[to + TILE_ROWS * (12 + q) + r] = mn_high


@njit(inline="always")
def _scale_pairs(qtype, sub_scales, sb, pairs):
    """pairs[16 j + r]: row r's int16 scales of bytes 0, 1 (low) and 2, 3 (high) of the quads (superblock_tiles.py):
    Q4_K's and Q5_K's sub-blocks 2 j and 2 j + 1 (quads 2 j and 2 j + 1, j < 4), Q6_K's 16-value sub-blocks
    4 c + h and 4 c + 2 + h (quad j = 2 c + h). sub_scales: Q6_K's as its tile holds them, Q4_K's and Q5_K's
    unpacked (_unpack_k4_scales: 16 bytes per super-block and row, the scales before the mins)."""
    if qtype == Q6_K:
        for j in range(8):
            low = (16 * sb + 4 * (j // 2) + j % 2) * TILE_ROWS
            store16(pairs, TILE_ROWS * j, scale_pairs16(sub_scales, low, low + 2 * TILE_ROWS, True))
    else:
        for j in range(4):
            low = (16 * sb + 2 * j) * TILE_ROWS
            store16(pairs, TILE_ROWS * j, scale_pairs16(sub_scales, low, low + TILE_ROWS, False))
