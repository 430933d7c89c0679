"""Grouped expert products: every chosen expert of a mixture-of-experts step multiplied by its rows in ONE call.

A step's (row, expert) slots are sorted by expert, so each expert's rows lie in one run of a gathered matrix of
activations (quantized once for the step: quantizing is per row, so gathering the quantized rows is quantizing the
gathered ones). An expert tensor (E, rows, cols) is its experts' matrices back to back, one (E x rows, cols) matrix
repacked into 16-row tiles as a dense layer's (tiles.py, superblock_tiles.py), expert e's tiles from
e x tiles_per_expert. The kernel's work items are (active expert, tile) pairs, one prange over all of them: each
multiplies one tile by its expert's run of rows, with the dense tile kernels' integer dots and float steps
(tile_kernels.py, whose per-tile loop this repeats over a run of rows) in passes of `tokens`, 8 and 4 (K-quants),
2, then 1 rows. A row's bits are the same in any pass and whatever the run around it, so a row's output is independent of the batch
and equal to the dense tile kernel's for the same matrix.

The K-quants' kernel is grouped_superblocks.py's.

A call takes one or two tile sets (`parts`): gate and up, their outputs side by side [gate | up] per row (one
call for both, so the activations are quantized once and the work is balanced over both), or down alone.
"""

from __future__ import annotations

import numba
import numpy as np
from gguf import GGMLQuantizationType
from numba.np.ufunc.parallel import _iget_num_threads  # the running pool's size, callable in cached code
from numba import prange

from miro.core.kernels.cache_key import HELPERS, cached_variant
from miro.core.kernels.cpu import Tier
from miro.core.kernels.int8_dots import (
    tile_dot,
)
from miro.core.kernels.quant_blocks import BLOCK32_TYPES
from miro.core.kernels.simd import LANES, load16_e8m0, load16_f16, zeros16
from miro.core.kernels.tile_steps import (
    FLOAT_BIAS,
    float_bias_bits,
    float_step,
    store_tile_row,
    tile_constants,
)
from miro.core.kernels.tiles import TILE_ROWS


# ---------------------------------------------------------------- 32-value blocks (Q4_0 ... Q8_0, MXFP4)


def grouped_32(qtype: int, tier: Tier, tokens: int):
    """The grouped kernel of a 32-value block type on a tier with int8 dots, `tokens` rows a pass (the type's
    tile_tokens): kernel(quants0, scales0, mins0, quants1, scales1, mins1, parts, tiles_per_expert, a, d, s, qsum,
    starts, active, out). Tile sets as tiles.Tiles' arrays; a, d, s, qsum the gathered rows' Q8_0 blocks
    (quantize_activations.quantize_q8_32); rows starts[e]:starts[e + 1] are expert e's; active the experts with
    rows; out (rows, parts x tiles_per_expert x 16)."""
    if qtype not in BLOCK32_TYPES or not tier.int8_dot:
        return None
    has_min, offset, block_quants, vnni, e8m0 = tile_constants(qtype, tier)
    bits = 512 if tier.vector_bits == 512 else 256
    float_bias = float_bias_bits(qtype)
    begins = int(offset != 0 or float_bias != 0)  # tiles_32's: where the integer sums begin
    helpers = HELPERS

    @cached_variant(f"{GGMLQuantizationType(qtype).name}_{tier.name.replace('-', '_')}_x{tokens}", parallel=True)
    def grouped_tiles_32(
        quants0, scales0, mins0, quants1, scales1, mins1, parts, tiles_per_expert, a, d, s, qsum, starts, active, out
    ):
        helpers  # in numba's cache key: see cache_key.py
        k = a.shape[1]
        n_blocks = k // 32
        a_flat = a.reshape(a.size)
        per_expert = parts * tiles_per_expert
        n_rows = a.shape[0]
        start = np.zeros(n_rows * n_blocks if begins else 1, np.int32)
        if begins:
            for t in range(n_rows):
                for b in range(n_blocks):
                    start[t * n_blocks + b] = offset * qsum[t, b] + float_bias
        all_spill = np.empty((_iget_num_threads(), LANES), np.float32)
        for item in prange(active.shape[0] * per_expert):
            spill = all_spill[numba.get_thread_id()]
            e = active[item // per_expert]
            j = item % per_expert
            part, tile = j // tiles_per_expert, e * tiles_per_expert + j % tiles_per_expert
            if part == 0:
                tile_quants, tile_scales, tile_mins = quants0[tile], scales0[tile], mins0[tile]
            else:
                tile_quants, tile_scales, tile_mins = quants1[tile], scales1[tile], mins1[tile]
            n0 = j * TILE_ROWS
            first, end = starts[e], starts[e + 1]
            n_eights = first + ((end - first) // 8) * 8 if tokens == 8 else first
            n_twos = end - (end - n_eights) % 2
            zero = zeros16()
            for t in range(first, n_eights, 8):
                c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = zero
                for b in range(n_blocks):
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
            if n_twos < end:  # the run's last row alone
                t = n_twos
                c0 = zero
                for b in range(n_blocks):
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

    return grouped_tiles_32
