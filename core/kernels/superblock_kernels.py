"""The K-quant tile kernel: Q4_K, Q5_K and Q6_K weights repacked into 16-row tiles (superblock_tiles.py) times 8-bit
activations, any number of activation rows, on every CPU tier with int8 dots (cpu.py); tile_kernels.tiles_32's
design for super-blocks. On an AMX host, amx_superblocks.py can take its integer dots (the same sums, tiles_k's float
steps) from the rows the type's row of the weight-type table says (`amx_from`).

`tiles_k` takes 16 activation rows a pass (the rows' tile_tokens in weight_types.py), each super-block's exact
integer sum per row and token built in int32 and given one float step, as ggml's x86 repack kernel does. On 512-bit
VNNI tiers the tiles' quads lie in the values' order and superblock_dots.superblock_unit_vnni builds the sums by vpdpbusd
(superblock_tiles.natural_order); elsewhere superblock_tile_sum by vpmaddubsw. A tile's scale pairs and mins are
unpacked once per call, not per pass. The rows past the last full pass take passes of 8 and 4 (mid_passes), then 2,
then 1 (no padding), in the same call; a row's bits are the same in any pass. Passes of 1, and of 2 on 256-bit
tiers, have constant units (immediate shifts); Q6_K's passes of 1 on the vpmaddubsw tiers take q6_k_row.py's sums.
"""

from __future__ import annotations

import numba
from gguf import GGMLQuantizationType
from numba.np.ufunc.parallel import _iget_num_threads  # the running pool's size, callable in cached code
from numba import prange
import numpy as np

from miro.core.kernels.cache_key import HELPERS, cached_variant
from miro.core.kernels.cpu import Tier
from miro.core.kernels.q6_k_row import q6_k_row_sum, q6_k_sum_pairs
from miro.core.kernels.quant_blocks import Q6_K, SUPERBLOCK_TYPES
from miro.core.kernels.quantize_activations import rows_to_q8_k
from miro.core.kernels.simd import LANES, load16, load16_f16, prefetch_l2_lines, store16, to_float
from miro.core.kernels.superblock_dots import (
    lanes_per_call,
    mins_dot,
    split_sums,
    superblock_tile_sum,
    superblock_unit_vnni,
)
from miro.core.kernels.superblock_tiles import (
    LANE_BYTES,
    PREFETCH_AHEAD,
    begin_sums,
    k4_tile_pairs,
    natural_order,
    prefetch_quarter,
    q6_k_group_starts,
    q6_k_scale_pairs,
    sub_block_sum_pairs,
)
from miro.core.kernels.tile_steps import store_tile_row
from miro.core.kernels.tiles import TILE_ROWS


def mid_passes(qtype: int, tier: Tier) -> tuple[int, ...]:
    """The K-quant tile kernel's rows per pass between its tile_tokens and 2, largest first: 8 and 4, where a pass
    of 2 unpacks a call's weights for 2 rows only. AVX2 (one Xeon core, emulated): 4 and 8 rows ran 1.2-1.65x their
    passes of 2; AVX-512 VNNI (Zen 4, 2 threads, weights in L3): 44 rows 1.34x (Q4_K), 1.38x (Q6_K), 47 rows 1.29x,
    1.64x, 13 rows 1.56x the speed of passes of 16 then 2 and 1."""
    if qtype not in SUPERBLOCK_TYPES or not tier.int8_dot:
        return ()
    return (8, 4)


def tiles_k(qtype: int, tier: Tier, tokens: int):
    """The K-quant tile kernel (superblock_tiles.py) for one weight type on one tier, `tokens` activation rows
    per pass, the rest 8 and 4 (mid_passes), 2 and then 1 a pass: kernel(quants, scales, mins, sub_scales, a, d,
    sum32, out, x), x float rows quantized in place of a, d, sum32 (as tile_kernels.tiles_32's), or (0, 0)."""
    if qtype not in SUPERBLOCK_TYPES or not tier.int8_dot:
        return None
    bits = 512 if tier.vector_bits == 512 else 256
    vnni = int(tier.has_vnni)
    lane_bytes = LANE_BYTES[qtype]
    has_mins = qtype != Q6_K
    natural = natural_order(qtype, tier)
    signed_q6 = natural and not has_mins
    centred = not natural and not has_mins  # Q6_K by vpmaddubsw: q - 32 against the activations + 128 (a_dots)
    if centred and tokens % 2:
        raise ValueError("tiles_k: Q6_K's lone row (q6_k_row.py) takes passes of an even row count")
    per_call, per_call_2 = lanes_per_call(qtype, bits, tokens), lanes_per_call(qtype, bits, 2)
    per_call_4, per_call_8 = lanes_per_call(qtype, bits, 4), lanes_per_call(qtype, bits, 8)
    mid = len(mid_passes(qtype, tier)) > 0  # passes of 8 and 4 between `tokens` and 2
    fixed_units_2 = bits == 256 and not natural  # passes of 2 call superblock_tile_sum with constant units
    sets = 2 if split_sums(bits, tokens) else 1  # sets of integer sums (superblock_dots.superblock_tile_sum)
    helpers = HELPERS

    @cached_variant(f"{GGMLQuantizationType(qtype).name}_{tier.name.replace('-', '_')}_x{tokens}", parallel=True)
    def matmul_tiles_k(quants, scales, mins, sub_scales, a, d, sum32, out, x):
        """out (T, N) = tiles of N rows times Q8_K activations a (T, K) int8 in the tiles' order (quantize_q8_k_quads,
        or quantize_q8_k in the values' order); d (T, K / 256), sum32 (T, K / 32). Per row and token, as ggml's x86
        repack kernel (ggml_gemm_q4_K_8x8_q8_K): acc += (d_w * d_a) x each super-block's exact integer sum (sub-block
        scales applied), acc_mins += (dmin * d_a) x sum(mins * bsums), out = acc - acc_mins. Q6_K's offset of 32:
        superblock_tiles.py (the full passes) and q6_k_group_starts (the rows after them, in the values' order)."""
        helpers  # in numba's cache key: see cache_key.py
        if x.shape[0]:
            a, d, sum32 = rows_to_q8_k(x, not natural)
        n_tok, n_out = out.shape
        k = a.shape[1]
        n_super = k // 256
        n_tiles, tile_bytes = quants.shape
        flat_quants = quants.reshape(quants.size)
        a_flat = a.reshape(a.size)
        # Q6_K in the values' order (superblock_dots.superblock_unit_vnni): for the full passes' rows the activations + 128,
        # vpdpbusd's unsigned operand; for the rows after them the starts of their groups' int32 sums, [row - full][k / 8]
        full = n_tok // tokens * tokens
        a_unsigned = a_flat[: full * k].view(np.uint8) ^ np.uint8(0x80) if signed_q6 else np.empty(0, np.uint8)
        row_starts = q6_k_group_starts(a_flat[full * k :] if signed_q6 else a_flat[:0])
        # superblock_tile_sum's activations, as bytes: Q6_K's + 128 (centred: its values enter as q - 32, each row's
        # sums begun at its start in the tiles' mins, superblock_tiles.py), the others' as they are
        a_dots = a_flat.view(np.uint8) ^ np.uint8(0x80) if centred else a_flat.view(np.uint8)
        # Q4_K, Q5_K: int16 pairs of the activations' sums of sub-blocks 2 j and 2 j + 1 (|sum| <= 32 x 127), for
        # vpmaddwd against the pairs of mins, [token][super-block][j < 4]; Q6_K leaves no offset to take off
        sum_pairs = sub_block_sum_pairs(sum32, n_tok, n_super * 4 if has_mins else 0)
        # centred Q6_K's pass of one row (q6_k_row.py: its values unsigned, the offset off by the activations' 16-value
        # sums): an odd row count's last row, the passes before it all even
        lone_sums = q6_k_sum_pairs(a, n_tok - 1, k) if centred and n_tok % 2 else np.empty(0, np.int32)
        pairs_per_super = 4 if has_mins else 8
        # each thread's scratch, once per call rather than per tile (a tile at one row is a few microseconds)
        n_threads = _iget_num_threads()  # at run time: thread ids lie below it (a cached constant did not)
        all_pairs = np.empty((n_threads, n_super * 8 * TILE_ROWS), np.int32)
        all_min_pairs = np.empty((n_threads, n_super * 4 * TILE_ROWS if has_mins else 0), np.int32)
        all_sums = np.empty((n_threads, 3, sets * tokens * TILE_ROWS), np.int32)
        all_spill = np.empty((n_threads, LANES), np.float32)
        for tile in prange(n_tiles):
            thread = numba.get_thread_id()
            # per super-block, once per call: the int16 scale pairs of its quads (Q4_K, Q5_K: 4 of 8; Q6_K: 8),
            # [super-block][quad][row], and the mins of sub-block pairs [super-block][pair][row]
            pairs, min_pairs, spill = all_pairs[thread], all_min_pairs[thread], all_spill[thread]
            tile_sub_scales = sub_scales[tile]
            tile_starts = mins[tile].view(np.int32)  # Q6_K's row starts where centred
            for sb in range(n_super):
                if has_mins:
                    k4_tile_pairs(
                        tile_sub_scales, 12 * TILE_ROWS * sb, pairs, sb * 8 * TILE_ROWS, min_pairs, sb * 4 * TILE_ROWS
                    )
                elif not natural:
                    q6_k_scale_pairs(tile_sub_scales, sb, pairs[sb * 8 * TILE_ROWS :])
            isums = all_sums[thread, 0]  # a super-block's integer sums, [token][row]
            acc = all_sums[thread, 1].view(np.float32)
            acc_mins = all_sums[thread, 2].view(np.float32)
            t0 = 0
            while t0 < n_tok:
                # this pass's rows: `tokens`, then 8 and 4 where `mid`, 2, 1; one expression (`n` assigned in two
                # branches of an if corrupted the heap with 2 threads)
                left = n_tok - t0
                n = (
                    tokens
                    if left >= tokens
                    else 8
                    if mid and left >= 8
                    else 4
                    if mid and left >= 4
                    else 2
                    if left >= 2
                    else 1
                )
                acc[: n * TILE_ROWS] = 0  # this pass's rows only
                acc_mins[: n * TILE_ROWS] = 0
                for sb in range(n_super):
                    begin_sums(isums, tile_starts, sb, n, sets, centred and n > 1)
                    w_at = tile * tile_bytes + 8 * sb * lane_bytes
                    ahead = w_at + PREFETCH_AHEAD * 8 * lane_bytes  # where the passes of 2 and 1 prefetch
                    p_at = sb * 8 * TILE_ROWS
                    a_at = t0 * k + 256 * sb
                    # a first pass of 4 rows or more (the full one, or one of 8 or 4) brings the next tile's
                    # super-block into L2, as the passes after it read this tile from the caches: the 1B shape's B=64
                    # decode GEMMs 1.89-1.94x the int8 floor, 2.21-2.70x without (step_time.py, in turn); AVX2's
                    # passes of 8, median 2.19x -> 3.23x llama.cpp (quant_linear.py --tier avx2 --tokens 8)
                    if t0 == 0 and n >= 4:
                        prefetch_l2_lines(flat_quants, w_at + tile_bytes, w_at + tile_bytes + 8 * lane_bytes)
                    elif n == 2 and not natural:  # off the values' order, passes of 2 stream PREFETCH_AHEAD on: AVX2
                        # median 0.76x -> 1.16x llama.cpp (quant_linear.py --tier avx2 --tokens 2); passes of 1 so moved
                        # both ways (median 0.59x -> 0.75x, some shapes 0.79x -> 0.31x): a quarter before each unit
                        prefetch_l2_lines(flat_quants, ahead, ahead + 8 * lane_bytes)
                    if natural:  # vpdpbusd on quads within one sub-block (superblock_tiles.natural_order)
                        # scales: Q4_K's, Q5_K's pairs, Q6_K's int8 ones as the tile holds them. One loop of `unit` (not
                        # `c`, the loop below's, nor a second `unit`): two loops of one name in a prange body broke sums
                        scale_src = pairs if has_mins else tile_sub_scales
                        s_at = p_at if has_mins else 16 * TILE_ROWS * sb
                        a_src = a_flat if has_mins else a_unsigned
                        st_at = (t0 - full) * (k // 8) + 32 * sb
                        if n >= 4:  # a full pass, or a mid one (mid_passes) from a_flat and row_starts as 2 and 1
                            for unit in range(4):
                                if n == tokens:
                                    superblock_unit_vnni(
                                        flat_quants,
                                        w_at,
                                        scale_src,
                                        s_at,
                                        a_src,
                                        a_at,
                                        k,
                                        isums,
                                        unit,
                                        row_starts,
                                        0,
                                        qtype,
                                        tokens,
                                    )
                                elif n == 8:
                                    superblock_unit_vnni(
                                        flat_quants,
                                        w_at,
                                        scale_src,
                                        s_at,
                                        a_flat,
                                        a_at,
                                        k,
                                        isums,
                                        unit,
                                        row_starts,
                                        st_at,
                                        qtype,
                                        8,
                                    )
                                else:
                                    superblock_unit_vnni(
                                        flat_quants,
                                        w_at,
                                        scale_src,
                                        s_at,
                                        a_flat,
                                        a_at,
                                        k,
                                        isums,
                                        unit,
                                        row_starts,
                                        st_at,
                                        qtype,
                                        4,
                                    )
                        elif n == 2:  # the units constants (their shifts immediate), as superblock_tile_sum's at 1 row
                            prefetch_quarter(flat_quants, ahead, lane_bytes, 0)
                            superblock_unit_vnni(
                                flat_quants,
                                w_at,
                                scale_src,
                                s_at,
                                a_flat,
                                a_at,
                                k,
                                isums,
                                0,
                                row_starts,
                                st_at,
                                qtype,
                                2,
                            )
                            prefetch_quarter(flat_quants, ahead, lane_bytes, 1)
                            superblock_unit_vnni(
                                flat_quants,
                                w_at,
                                scale_src,
                                s_at,
                                a_flat,
                                a_at,
                                k,
                                isums,
                                1,
                                row_starts,
                                st_at,
                                qtype,
                                2,
                            )
                            prefetch_quarter(flat_quants, ahead, lane_bytes, 2)
                            superblock_unit_vnni(
                                flat_quants,
                                w_at,
                                scale_src,
                                s_at,
                                a_flat,
                                a_at,
                                k,
                                isums,
                                2,
                                row_starts,
                                st_at,
                                qtype,
                                2,
                            )
                            prefetch_quarter(flat_quants, ahead, lane_bytes, 3)
                            superblock_unit_vnni(
                                flat_quants,
                                w_at,
                                scale_src,
                                s_at,
                                a_flat,
                                a_at,
                                k,
                                isums,
                                3,
                                row_starts,
                                st_at,
                                qtype,
                                2,
                            )
                        else:
                            prefetch_quarter(flat_quants, ahead, lane_bytes, 0)
                            superblock_unit_vnni(
                                flat_quants,
                                w_at,
                                scale_src,
                                s_at,
                                a_flat,
                                a_at,
                                k,
                                isums,
                                0,
                                row_starts,
                                st_at,
                                qtype,
                                1,
                            )
                            prefetch_quarter(flat_quants, ahead, lane_bytes, 1)
                            superblock_unit_vnni(
                                flat_quants,
                                w_at,
                                scale_src,
                                s_at,
                                a_flat,
                                a_at,
                                k,
                                isums,
                                1,
                                row_starts,
                                st_at,
                                qtype,
                                1,
                            )
                            prefetch_quarter(flat_quants, ahead, lane_bytes, 2)
                            superblock_unit_vnni(
                                flat_quants,
                                w_at,
                                scale_src,
                                s_at,
                                a_flat,
                                a_at,
                                k,
                                isums,
                                2,
                                row_starts,
                                st_at,
                                qtype,
                                1,
                            )
                            prefetch_quarter(flat_quants, ahead, lane_bytes, 3)
                            superblock_unit_vnni(
                                flat_quants,
                                w_at,
                                scale_src,
                                s_at,
                                a_flat,
                                a_at,
                                k,
                                isums,
                                3,
                                row_starts,
                                st_at,
                                qtype,
                                1,
                            )
                    elif n == 1 and centred:  # half the super-block PREFETCH_AHEAD on before each half: AVX2,
                        # 0.41-0.59x -> 0.70-1.29x llama.cpp (quant_linear.py --tier avx2 --tokens 1); a burst, 0.64-0.84x
                        half_at = ahead + 4 * lane_bytes
                        prefetch_l2_lines(flat_quants, ahead, half_at)
                        q6_k_row_sum(
                            flat_quants, w_at, pairs, p_at, a_flat, a_at, lone_sums, 8 * sb, isums, bits, vnni, 0
                        )
                        prefetch_l2_lines(flat_quants, half_at, half_at + 4 * lane_bytes)
                        q6_k_row_sum(
                            flat_quants, w_at, pairs, p_at, a_flat, a_at, lone_sums, 8 * sb, isums, bits, vnni, 1
                        )
                    elif n == 1:  # all 8 lanes a call (lanes_per_call), the units constants: their shifts immediate;
                        # a quarter of the super-block PREFETCH_AHEAD on before each unit: AVX2, Q4_K 0.58-0.84x ->
                        # 0.78-0.99x llama.cpp, Q5_K 0.56-0.74x -> 0.99-1.30x (quant_linear.py --tier avx2 --tokens 1)
                        prefetch_quarter(flat_quants, ahead, lane_bytes, 0)
                        superblock_tile_sum(
                            flat_quants, w_at, pairs, p_at, a_dots, a_at, k, isums, 0, 0, bits, vnni, qtype, 1
                        )
                        prefetch_quarter(flat_quants, ahead, lane_bytes, 1)
                        superblock_tile_sum(
                            flat_quants, w_at, pairs, p_at, a_dots, a_at, k, isums, 1, 0, bits, vnni, qtype, 1
                        )
                        prefetch_quarter(flat_quants, ahead, lane_bytes, 2)
                        superblock_tile_sum(
                            flat_quants, w_at, pairs, p_at, a_dots, a_at, k, isums, 2, 0, bits, vnni, qtype, 1
                        )
                        prefetch_quarter(flat_quants, ahead, lane_bytes, 3)
                        superblock_tile_sum(
                            flat_quants, w_at, pairs, p_at, a_dots, a_at, k, isums, 3, 0, bits, vnni, qtype, 1
                        )
                    elif n == 2 and fixed_units_2:  # the units constants, their shifts immediate, as at one row
                        for first in range(0, 8, per_call_2):
                            superblock_tile_sum(
                                flat_quants, w_at, pairs, p_at, a_dots, a_at, k, isums, 0, first, bits, vnni, qtype, 2
                            )
                            superblock_tile_sum(
                                flat_quants, w_at, pairs, p_at, a_dots, a_at, k, isums, 1, first, bits, vnni, qtype, 2
                            )
                            superblock_tile_sum(
                                flat_quants, w_at, pairs, p_at, a_dots, a_at, k, isums, 2, first, bits, vnni, qtype, 2
                            )
                            superblock_tile_sum(
                                flat_quants, w_at, pairs, p_at, a_dots, a_at, k, isums, 3, first, bits, vnni, qtype, 2
                            )
                    for c in range(4 if (n > 2 or n == 2 and not fixed_units_2) and not natural else 0):
                        if n == tokens:
                            for lane in range(0, 8, per_call):
                                superblock_tile_sum(
                                    flat_quants,
                                    w_at,
                                    pairs,
                                    p_at,
                                    a_dots,
                                    a_at,
                                    k,
                                    isums,
                                    c,
                                    lane,
                                    bits,
                                    vnni,
                                    qtype,
                                    tokens,
                                )
                        elif mid and n == 8:
                            for lane in range(0, 8, per_call_8):
                                superblock_tile_sum(
                                    flat_quants,
                                    w_at,
                                    pairs,
                                    p_at,
                                    a_dots,
                                    a_at,
                                    k,
                                    isums,
                                    c,
                                    lane,
                                    bits,
                                    vnni,
                                    qtype,
                                    8,
                                )
                        elif mid and n == 4:
                            for lane in range(0, 8, per_call_4):
                                superblock_tile_sum(
                                    flat_quants,
                                    w_at,
                                    pairs,
                                    p_at,
                                    a_dots,
                                    a_at,
                                    k,
                                    isums,
                                    c,
                                    lane,
                                    bits,
                                    vnni,
                                    qtype,
                                    4,
                                )
                        else:
                            for lane in range(0, 8, per_call_2):
                                superblock_tile_sum(
                                    flat_quants,
                                    w_at,
                                    pairs,
                                    p_at,
                                    a_dots,
                                    a_at,
                                    k,
                                    isums,
                                    c,
                                    lane,
                                    bits,
                                    vnni,
                                    qtype,
                                    2,
                                )
                    if sets == 2 and n >= 4:  # the second set of sums (superblock_dots.split_sums)
                        for t in range(n):
                            store16(
                                isums, TILE_ROWS * t, load16(isums, TILE_ROWS * t) + load16(isums, TILE_ROWS * (n + t))
                            )
                    dw = load16_f16(scales[tile], TILE_ROWS * sb)
                    for t in range(n):
                        at = TILE_ROWS * t
                        total = load16(isums, at)
                        store16(acc, at, load16(acc, at) + (dw * d[t0 + t, sb]) * to_float(total))
                    if has_mins:
                        dmin = load16_f16(mins[tile], TILE_ROWS * sb)
                        for t in range(n):
                            sum_mins = mins_dot(
                                min_pairs, sb * 4 * TILE_ROWS, sum_pairs[t0 + t], pairs_per_super * sb, bits, 4
                            )
                            at = TILE_ROWS * t
                            store16(acc_mins, at, load16(acc_mins, at) + (dmin * d[t0 + t, sb]) * to_float(sum_mins))
                for t in range(n):
                    at = TILE_ROWS * t
                    total = load16(acc, at) - load16(acc_mins, at) if has_mins else load16(acc, at)
                    store_tile_row(out, t0 + t, tile * TILE_ROWS, total, spill)
                t0 += n
        return out

    return matmul_tiles_k
