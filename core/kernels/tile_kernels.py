"""The tile kernel: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and MXFP4 weights repacked into 16-row tiles (tiles.py) times 8-bit
activations, any number of activation rows, on every CPU tier with int8 dot products (cpu.py).

One decoded weight vector serves several activation rows, each activation quad broadcast to every weight
row; the float sums sit in registers of 16 lanes, one lane per weight row, over all of K. The number of
activation rows per pass is set by the tier's registers:

- 512-bit tiers (32 zmm): 8 rows, 8 sums of 16 lanes, the 8 int32 dots beside them;
- 256-bit tiers (16 ymm): 2 rows, each 16-lane sum two ymm, its int16 or int32 dots two more;
- the rows past the last full pass: 2 a pass, then the last one alone, in the same call (padding a row would
  multiply the work: 1 row padded to 2 did twice the dots).

Integer sums are exact; the float steps are add_block32's, block after block, so every tier and every row count
gives the bits of quant_kernels.py's portable kernels. They take fewer instructions here (tile_steps.float_step):
each block's int32 sums begin at offset x the activations' sum (a broadcast load where a zeroing was, not a vpaddd
and a broadcast after the dots), Q4_0's also at a float bias that folds to_float into its first product's fma, and
Q4_1's and Q5_1's exact m x s_act product goes into one fma. Per block of 16 weight rows and one activation row on
AVX-512 VNNI: 8 vpdpbusd, then 5 float instructions (Q4_1; 6 before), 3 (Q4_0; 6) or 4 (Q8_0, Q5_0; 6). On an AMX
host, amx_tiles.py can take the integer dots of Q4_0, Q4_1 and Q8_0 for 16 activation rows at a time (the same sums,
the same float_step), from the rows the type's row of the weight-type table says (`amx_from`). A tile's first pass
brings the next tile's weights into L2 block by block (the passes after it read the tile from the caches). The
K-quants' tile kernel is superblock_kernels.py's tiles_k.
"""

from __future__ import annotations

import numba
from gguf import GGMLQuantizationType
from numba.np.ufunc.parallel import _iget_num_threads  # the running pool's size, callable in cached code
from numba import prange
import numpy as np

from miro.core.kernels.cache_key import HELPERS, cached_variant
from miro.core.kernels.cpu import Tier
from miro.core.kernels.quantize_activations import rows_to_q8_32
from miro.core.kernels.int8_dots import tile_dot
from miro.core.kernels.quant_blocks import BLOCK32_TYPES
from miro.core.kernels.simd import LANES, load16_e8m0, load16_f16, prefetch_l2_lines, zeros16
from miro.core.kernels.tile_steps import FLOAT_BIAS, float_bias_bits, float_step, store_tile_row, tile_constants
from miro.core.kernels.tiles import TILE_ROWS


def tiles_32(qtype: int, tier: Tier, tokens: int):
    """The tile kernel for one weight type on one tier, `tokens` (8 or 2) activation rows per pass, the rows past
    the last full pass 2 and then 1 a pass: kernel(quants, scales, mins, a, d, s, qsum, out, x)."""
    if qtype not in BLOCK32_TYPES or not tier.int8_dot:
        return None
    has_min, offset, block_quants, vnni, e8m0 = tile_constants(qtype, tier)
    bits = 512 if tier.vector_bits == 512 else 256
    float_bias = float_bias_bits(qtype)
    begins = int(offset != 0 or float_bias != 0)  # the integer sums begin at offset x qsum (+ the float bias), not 0
    helpers = HELPERS

    @cached_variant(f"{GGMLQuantizationType(qtype).name}_{tier.name.replace('-', '_')}_x{tokens}", parallel=True)
    def matmul_tiles_32(quants, scales, mins, a, d, s, qsum, out, x):
        """out (T, N) = tiles of N rows times activations a (T, K) int8, row-major; d, s, qsum (T, K / 32). 16 weight
        rows times `tokens` activation rows at a time, then 2, then the last row alone: no row is padding. x (T, K)
        float32: the rows as floats, quantized here in place of a, d, s, qsum (a decode's lone row: one compiled call
        rather than two, Linear._lone_row); (0, 0): none."""
        helpers  # in numba's cache key: see cache_key.py
        if x.shape[0]:
            a, d, s, qsum = rows_to_q8_32(x)
        n_tok, n_out = out.shape
        k = a.shape[1]
        n_blocks = k // 32
        a_flat = a.reshape(a.size)
        n_eights = n_tok - n_tok % 8 if tokens == 8 else 0  # rows in passes of 8
        n_twos = n_tok - (n_tok - n_eights) % 2  # rows in passes of 8 or 2; one row may be left
        # where each block's integer sums begin, [token][block]: the offset's share, once per call
        start = np.zeros(n_tok * n_blocks if begins else 1, np.int32)
        if begins:
            for t in range(n_tok):
                for b in range(n_blocks):
                    start[t * n_blocks + b] = offset * qsum[t, b] + float_bias
        all_spill = np.empty((_iget_num_threads(), LANES), np.float32)  # each thread's, once per call
        n_tiles, tile_bytes = quants.shape
        flat_quants = quants.reshape(quants.size)
        for tile in prange(n_tiles):
            spill = all_spill[numba.get_thread_id()]
            tile_quants, tile_scales, tile_mins = quants[tile], scales[tile], mins[tile]
            n0 = tile * TILE_ROWS
            zero = zeros16()
            # the tile's first pass brings the next tile's block into L2 as it reads its own (the weights come from
            # memory, each tile read once a call, then from the caches for the passes after)
            ahead = (tile + 1) * tile_bytes  # the last tile's: the array's end, where prefetch_l2_lines stops
            for t in range(0, n_eights, 8):
                c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = zero
                for b in range(n_blocks):
                    if t == 0:
                        prefetch_l2_lines(flat_quants, ahead + b * block_quants, ahead + (b + 1) * block_quants)
                    i0, i1, i2, i3, i4, i5, i6, i7 = tile_dot(
                        tile_quants,
                        b * block_quants,
                        a_flat,
                        t * k + 32 * b,
                        k,
                        bits,
                        vnni,
                        qtype,
                        8,
                        begins,
                        start,
                        (t * n_blocks + b) if begins else 0,
                        n_blocks if begins else 0,
                    )
                    dw = load16_e8m0(tile_scales, 16 * b) if e8m0 else load16_f16(tile_scales, 16 * b)
                    mw = load16_f16(tile_mins, 16 * b) if has_min else zero
                    dw_bias = dw * -FLOAT_BIAS if float_bias else zero
                    c0 = float_step(qtype, c0, i0, dw, dw_bias, mw, d[t, b], s[t, b])
                    c1 = float_step(qtype, c1, i1, dw, dw_bias, mw, d[t + 1, b], s[t + 1, b])
                    c2 = float_step(qtype, c2, i2, dw, dw_bias, mw, d[t + 2, b], s[t + 2, b])
                    c3 = float_step(qtype, c3, i3, dw, dw_bias, mw, d[t + 3, b], s[t + 3, b])
                    c4 = float_step(qtype, c4, i4, dw, dw_bias, mw, d[t + 4, b], s[t + 4, b])
                    c5 = float_step(qtype, c5, i5, dw, dw_bias, mw, d[t + 5, b], s[t + 5, b])
                    c6 = float_step(qtype, c6, i6, dw, dw_bias, mw, d[t + 6, b], s[t + 6, b])
                    c7 = float_step(qtype, c7, i7, dw, dw_bias, mw, d[t + 7, b], s[t + 7, b])
                store_tile_row(out, t, n0, c0, spill)
                store_tile_row(out, t + 1, n0, c1, spill)
                store_tile_row(out, t + 2, n0, c2, spill)
                store_tile_row(out, t + 3, n0, c3, spill)
                store_tile_row(out, t + 4, n0, c4, spill)
                store_tile_row(out, t + 5, n0, c5, spill)
                store_tile_row(out, t + 6, n0, c6, spill)
                store_tile_row(out, t + 7, n0, c7, spill)
            for t in range(n_eights, n_twos, 2):
                c0 = c1 = zero
                for b in range(n_blocks):
                    if t == 0:
                        prefetch_l2_lines(flat_quants, ahead + b * block_quants, ahead + (b + 1) * block_quants)
                    i0, i1 = tile_dot(
                        tile_quants,
                        b * block_quants,
                        a_flat,
                        t * k + 32 * b,
                        k,
                        bits,
                        vnni,
                        qtype,
                        2,
                        begins,
                        start,
                        (t * n_blocks + b) if begins else 0,
                        n_blocks if begins else 0,
                    )
                    dw = load16_e8m0(tile_scales, 16 * b) if e8m0 else load16_f16(tile_scales, 16 * b)
                    mw = load16_f16(tile_mins, 16 * b) if has_min else zero
                    dw_bias = dw * -FLOAT_BIAS if float_bias else zero
                    c0 = float_step(qtype, c0, i0, dw, dw_bias, mw, d[t, b], s[t, b])
                    c1 = float_step(qtype, c1, i1, dw, dw_bias, mw, d[t + 1, b], s[t + 1, b])
                store_tile_row(out, t, n0, c0, spill)
                store_tile_row(out, t + 1, n0, c1, spill)
            if n_twos < n_tok:  # the last row alone
                t = n_twos
                c0 = zero
                for b in range(n_blocks):
                    if t == 0:
                        prefetch_l2_lines(flat_quants, ahead + b * block_quants, ahead + (b + 1) * block_quants)
                    (i0,) = tile_dot(
                        tile_quants,
                        b * block_quants,
                        a_flat,
                        t * k + 32 * b,
                        k,
                        bits,
                        vnni,
                        qtype,
                        1,
                        begins,
                        start,
                        (t * n_blocks + b) if begins else 0,
                        0,
                    )
                    dw = load16_e8m0(tile_scales, 16 * b) if e8m0 else load16_f16(tile_scales, 16 * b)
                    mw = load16_f16(tile_mins, 16 * b) if has_min else zero
                    dw_bias = dw * -FLOAT_BIAS if float_bias else zero
                    c0 = float_step(qtype, c0, i0, dw, dw_bias, mw, d[t, b], s[t, b])
                store_tile_row(out, t, n0, c0, spill)
        return out

    return matmul_tiles_32
