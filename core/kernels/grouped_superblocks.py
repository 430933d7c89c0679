"""The grouped expert kernel of the K-quants (Q4_K, Q5_K, Q6_K): grouped_experts.py's design (a step's chosen
experts in one call, work items (active expert, tile), each a tile times its expert's run of rows) over the
super-block tiles, with superblock_kernels.tiles_k's integer sums and float steps, so a row's bits are the dense
kernel's whatever rows share its experts. Q6_K on the vpmaddubsw tiers comes one byte per value
(superblock_tiles.expert_byte_values), q - 32 against the activations + 128 in every pass, each row's sums begun at
its start in the tiles' mins, as tiles_k's centred passes."""

from __future__ import annotations

import numba
import numpy as np
from gguf import GGMLQuantizationType
from numba.np.ufunc.parallel import _iget_num_threads  # the running pool's size, callable in cached code
from numba import prange

from miro.core.kernels.cache_key import HELPERS, cached_variant
from miro.core.kernels.cpu import Tier
from miro.core.kernels.grouped_passes import pass_rows, prefetch_superblock, work_item
from miro.core.kernels.quant_blocks import Q6_K, Q6_K_BYTES, SUPERBLOCK_TYPES
from miro.core.kernels.simd import LANES, load16, load16_f16, store16, to_float
from miro.core.kernels.superblock_dots import (
    lanes_per_call,
    mins_dot,
    split_sums,
    superblock_tile_sum,
    superblock_unit_vnni,
)
from miro.core.kernels.superblock_tiles import (
    LANE_BYTES,
    begin_sums,
    expert_byte_values,
    k4_tile_pairs,
    natural_order,
    q6_k_scale_pairs,
    sub_block_sum_pairs,
)
from miro.core.kernels.tile_steps import store_tile_row
from miro.core.kernels.tiles import TILE_ROWS


def grouped_k(qtype: int, tier: Tier, tokens: int):
    """The grouped kernel of a K-quant on a tier with int8 dots, `tokens` rows a pass (the type's tile_tokens):
    kernel(quants0, scales0, mins0, sub_scales0, quants1, scales1, mins1, sub_scales1, parts, tiles_per_expert,
    a, d, sum32, starts, active, out). a, d, sum32: the gathered rows' Q8_K blocks in the tiles' order
    (superblock_tiles.natural_order: quantize_activations.quantize_q8_k, else quantize_q8_k_quads); the rest as
    grouped_32's."""
    if qtype not in SUPERBLOCK_TYPES or not tier.int8_dot:
        return None
    bits = 512 if tier.vector_bits == 512 else 256
    vnni = int(tier.has_vnni)
    has_mins = qtype != Q6_K
    natural = natural_order(qtype, tier)
    signed_q6 = natural and not has_mins
    # Q6_K by vpmaddubsw: its tiles one byte per value, q - 32, against the activations + 128 (a_dots) in every pass
    centred = expert_byte_values(qtype, tier)
    kind = Q6_K_BYTES if centred else qtype  # superblock_tile_sum's layout
    lane_bytes = LANE_BYTES[kind]
    per_call = lanes_per_call(kind, bits, 2)  # the same for every pass of 2 rows or more
    if any(lanes_per_call(kind, bits, rows) != per_call for rows in range(3, tokens + 1)):
        raise ValueError(f"{GGMLQuantizationType(qtype).name}: lanes per call differ by pass; the kernel takes one")
    fixed_units_2 = bits == 256 and not natural  # passes of 2 call superblock_tile_sum with constant units
    sets = 2 if split_sums(bits, tokens) else 1  # sets of integer sums (superblock_dots.superblock_tile_sum)
    helpers = HELPERS

    @cached_variant(f"{GGMLQuantizationType(qtype).name}_{tier.name.replace('-', '_')}_x{tokens}", parallel=True)
    def grouped_tiles_k(
        quants0,
        scales0,
        mins0,
        sub_scales0,
        quants1,
        scales1,
        mins1,
        sub_scales1,
        parts,
        tiles_per_expert,
        a,
        d,
        sum32,
        starts,
        active,
        out,
    ):
        helpers  # in numba's cache key: see cache_key.py
        n_tok = a.shape[0]
        k = a.shape[1]
        n_super = k // 256
        tile_bytes = quants0.shape[1]
        flat_quants0 = quants0.reshape(quants0.size)
        flat_quants1 = quants1.reshape(quants1.size)
        a_flat = a.reshape(a.size)
        # Q6_K in the values' order (superblock_dots.superblock_unit_vnni): for passes of 4 rows or more the activations +
        # 128, vpdpbusd's unsigned operand; for passes of 2 and 1 -32 x each 8 activations' sum, the start of their
        # int32 sums, [row][k / 8]
        a_unsigned = a_flat.view(np.uint8) ^ np.uint8(0x80) if signed_q6 else np.empty(0, np.uint8)
        row_starts = np.empty(n_tok * (k // 8) if signed_q6 else 0, np.int32)
        for g in range(row_starts.size):
            total = np.int32(0)
            for i in range(8):
                total += np.int32(a_flat[8 * g + i])
            row_starts[g] = np.int32(-32) * total
        # superblock_tile_sum's activations: Q6_K's + 128 where centred (its values q - 32, each row's sums begun at
        # its start in the tiles' mins: superblock_kernels.tiles_k), else as they are
        a_dots = a_flat.view(np.uint8) ^ np.uint8(0x80) if centred else a_flat.view(np.uint8)
        pairs_per_super = 4 if has_mins else 8
        # the int16 pairs of each row's sub-block sums, on the calling thread (a few microseconds for a decode step's
        # slots), so a call is one parallel region: Q4_K's, Q5_K's for their mins, as superblock_kernels.tiles_k makes
        # them (Q6_K leaves no offset to take off)
        sum_pairs = sub_block_sum_pairs(sum32, n_tok, n_super * 4 if has_mins else 0)
        n_threads = _iget_num_threads()  # at run time: thread ids lie below it (a cached constant did not)
        all_pairs = np.empty((n_threads, n_super * 8 * TILE_ROWS), np.int32)
        all_min_pairs = np.empty((n_threads, n_super * 4 * TILE_ROWS if has_mins else 0), np.int32)
        all_sums = np.empty((n_threads, 3, sets * tokens * TILE_ROWS), np.int32)
        all_spill = np.empty((n_threads, LANES), np.float32)
        per_expert = parts * tiles_per_expert
        n_items = active.shape[0] * per_expert
        flat_sub0 = sub_scales0.reshape(sub_scales0.size)
        flat_sub1 = sub_scales1.reshape(sub_scales1.size)
        sub_bytes = sub_scales0.shape[1]
        # numba's prange gives each thread one equal range of the items: ordered so that a thread's range holds its
        # share of every expert's tiles (_work_item), the threads' work is the same whatever the runs' lengths
        shares = n_threads if per_expert % n_threads == 0 else 1
        for item in prange(n_items):
            thread = numba.get_thread_id()
            e, j = work_item(item, active, per_expert, shares)
            part, tile = j // tiles_per_expert, e * tiles_per_expert + j % tiles_per_expert
            # the next item's tile (this thread's next, but at the end of its range), fetched during this one's
            # first pass: a decode step's experts have a few rows each, too little work per tile for the
            # hardware's prefetcher to hide the memory's latency
            next_e, next_j = work_item(
                min(np.int64(item) + np.int64(1), np.int64(n_items - 1)), active, per_expert, shares
            )
            next_part = next_j // tiles_per_expert
            next_tile = next_e * tiles_per_expert + next_j % tiles_per_expert
            if part == 0:
                flat_quants, tile_scales, tile_mins, tile_sub_scales = (
                    flat_quants0,
                    scales0[tile],
                    mins0[tile],
                    sub_scales0[tile],
                )
            else:
                flat_quants, tile_scales, tile_mins, tile_sub_scales = (
                    flat_quants1,
                    scales1[tile],
                    mins1[tile],
                    sub_scales1[tile],
                )
            pairs, min_pairs, spill = all_pairs[thread], all_min_pairs[thread], all_spill[thread]
            tile_starts = tile_mins.view(np.int32)  # Q6_K's row starts where centred (superblock_tiles.py)
            for sb in range(n_super):
                if has_mins:
                    k4_tile_pairs(
                        tile_sub_scales, 12 * TILE_ROWS * sb, pairs, sb * 8 * TILE_ROWS, min_pairs, sb * 4 * TILE_ROWS
                    )
                elif not natural:
                    q6_k_scale_pairs(tile_sub_scales, sb, pairs[sb * 8 * TILE_ROWS :])
            isums = all_sums[thread, 0]
            acc = all_sums[thread, 1].view(np.float32)
            acc_mins = all_sums[thread, 2].view(np.float32)
            t0, end = starts[e], starts[e + 1]
            while t0 < end:
                # this pass's rows: an expert's run is a few rows in a decode step, so 8 and 4 between `tokens`
                # and 2 (a row's bits are the same in any pass)
                n = pass_rows(end - t0, tokens, not natural)
                acc[: n * TILE_ROWS] = 0  # this pass's rows only
                acc_mins[: n * TILE_ROWS] = 0
                for sb in range(n_super):
                    if t0 == starts[e]:
                        prefetch_superblock(
                            flat_quants0 if next_part == 0 else flat_quants1,
                            next_tile * tile_bytes + 8 * sb * lane_bytes,
                            8 * lane_bytes,
                            flat_sub0 if next_part == 0 else flat_sub1,
                            next_tile * sub_bytes + sb * (sub_bytes // n_super),
                            sub_bytes // n_super,
                        )
                    begin_sums(isums, tile_starts, sb, n, sets, centred)
                    w_at = tile * tile_bytes + 8 * sb * lane_bytes
                    p_at = sb * 8 * TILE_ROWS
                    a_at = t0 * k + 256 * sb
                    if natural:  # vpdpbusd on quads within one sub-block (superblock_tiles.natural_order)
                        # Q4_K, Q5_K: their scale pairs; Q6_K: its int8 scales as the tile holds them, the activations
                        # + 128 in passes of 4 rows or more, as they are with row_starts in passes of 2 and 1. One loop
                        # of `unit`, not `c` (the loop below's): two loops of one name in a prange body broke the
                        # threads' sums
                        scale_src = pairs if has_mins else tile_sub_scales
                        s_at = p_at if has_mins else 16 * TILE_ROWS * sb
                        a_src = a_flat if has_mins else a_unsigned
                        st_at = t0 * (k // 8) + 32 * sb
                        for unit in range(4 if n > 2 else 0):
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
                                    a_src,
                                    a_at,
                                    k,
                                    isums,
                                    unit,
                                    row_starts,
                                    0,
                                    qtype,
                                    8,
                                )
                            else:
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
                                    4,
                                )
                        if n == 2:  # the units constants (their shifts immediate), as superblock_tile_sum's at 1 row
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
                        elif n == 1:
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
                    elif n == 1:
                        superblock_tile_sum(
                            flat_quants, w_at, pairs, p_at, a_dots, a_at, k, isums, 0, 0, bits, vnni, kind, 1
                        )
                        superblock_tile_sum(
                            flat_quants, w_at, pairs, p_at, a_dots, a_at, k, isums, 1, 0, bits, vnni, kind, 1
                        )
                        superblock_tile_sum(
                            flat_quants, w_at, pairs, p_at, a_dots, a_at, k, isums, 2, 0, bits, vnni, kind, 1
                        )
                        superblock_tile_sum(
                            flat_quants, w_at, pairs, p_at, a_dots, a_at, k, isums, 3, 0, bits, vnni, kind, 1
                        )
                    elif n == 2 and fixed_units_2:  # the units constants, their shifts immediate, as at one row
                        for first in range(0, 8, per_call):
                            superblock_tile_sum(
                                flat_quants, w_at, pairs, p_at, a_dots, a_at, k, isums, 0, first, bits, vnni, kind, 2
                            )
                            superblock_tile_sum(
                                flat_quants, w_at, pairs, p_at, a_dots, a_at, k, isums, 1, first, bits, vnni, kind, 2
                            )
                            superblock_tile_sum(
                                flat_quants, w_at, pairs, p_at, a_dots, a_at, k, isums, 2, first, bits, vnni, kind, 2
                            )
                            superblock_tile_sum(
                                flat_quants, w_at, pairs, p_at, a_dots, a_at, k, isums, 3, first, bits, vnni, kind, 2
                            )
                    # a run of 3 to 7 rows (a decode step's usual) in one pass: as 2 + 1 or 4 + 2 + 1 its rows cost
                    # 20-70% more, each pass unpacking the tile's weights again (pass_rows)
                    for c in range(4 if (n > 2 or n == 2 and not fixed_units_2) and not natural else 0):
                        for lane in range(0, 8, per_call):
                            if n == tokens:
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
                                    kind,
                                    tokens,
                                )
                            elif n == 8:
                                superblock_tile_sum(
                                    flat_quants, w_at, pairs, p_at, a_dots, a_at, k, isums, c, lane, bits, vnni, kind, 8
                                )
                            elif n == 7:
                                superblock_tile_sum(
                                    flat_quants, w_at, pairs, p_at, a_dots, a_at, k, isums, c, lane, bits, vnni, kind, 7
                                )
                            elif n == 6:
                                superblock_tile_sum(
                                    flat_quants, w_at, pairs, p_at, a_dots, a_at, k, isums, c, lane, bits, vnni, kind, 6
                                )
                            elif n == 5:
                                superblock_tile_sum(
                                    flat_quants, w_at, pairs, p_at, a_dots, a_at, k, isums, c, lane, bits, vnni, kind, 5
                                )
                            elif n == 4:
                                superblock_tile_sum(
                                    flat_quants, w_at, pairs, p_at, a_dots, a_at, k, isums, c, lane, bits, vnni, kind, 4
                                )
                            elif n == 3:
                                superblock_tile_sum(
                                    flat_quants, w_at, pairs, p_at, a_dots, a_at, k, isums, c, lane, bits, vnni, kind, 3
                                )
                            else:
                                superblock_tile_sum(
                                    flat_quants, w_at, pairs, p_at, a_dots, a_at, k, isums, c, lane, bits, vnni, kind, 2
                                )
                    if sets == 2 and n >= 4:  # the second set of sums (superblock_dots.split_sums)
                        for t in range(n):
                            store16(
                                isums, TILE_ROWS * t, load16(isums, TILE_ROWS * t) + load16(isums, TILE_ROWS * (n + t))
                            )
                    dw = load16_f16(tile_scales, TILE_ROWS * sb)
                    for t in range(n):
                        at = TILE_ROWS * t
                        total = load16(isums, at)
                        store16(acc, at, load16(acc, at) + (dw * d[t0 + t, sb]) * to_float(total))
                    if has_mins:
                        dmin = load16_f16(tile_mins, TILE_ROWS * sb)
                        for t in range(n):
                            sum_mins = mins_dot(
                                min_pairs, sb * 4 * TILE_ROWS, sum_pairs[t0 + t], pairs_per_super * sb, bits, 4
                            )
                            at = TILE_ROWS * t
                            store16(acc_mins, at, load16(acc_mins, at) + (dmin * d[t0 + t, sb]) * to_float(sum_mins))
                for t in range(n):
                    at = TILE_ROWS * t
                    total = load16(acc, at) - load16(acc_mins, at) if has_mins else load16(acc, at)
                    store_tile_row(out, t0 + t, j * TILE_ROWS, total, spill)
                t0 += n
        return out

    return grouped_tiles_k
