"""The K-quant tile kernel's integer dots on AMX (amx.py): Q4_K, Q5_K and Q6_K tiles (superblock_tiles.py, the
values' order of 512-bit VNNI tiers) times 16 activation rows at a time, each super-block's exact int32 sum per
(token, weight row) from one TDPBxxD per sub-block, then tile_kernels.tiles_k's float steps, so the same bits.

tiles_k on those tiers (int8_dots.superblock_unit_vnni) builds sum over sub-blocks j of sc[row, j] x dot_j by
vpdpbusd and vpdpwssd: about 117 instructions per super-block, 16 weight rows and token. Here, per tile of 16
weight rows, its quants are first unpacked to one byte a value (a per-thread copy: the B tiles), its sub-block
scales to int32 vectors; then per 16 activation rows and super-block:

- per sub-block j (Q4_K, Q5_K: 8 of 32 values; Q6_K: 16 of 16), C (tmm0-3 in turn) = A (16 activation rows x
  32 or 16 int8, the Q8_K activations as they are, tmm4-5) times B (the sub-block's 8 or 4 rows of 16 weight rows
  x 4 bytes, tmm6-7), stored to a per-thread buffer: TDPBSUD against Q4_K's and Q5_K's unsigned values, TDPBSSD
  against Q6_K's q - 32 (so no offset is left to take off);
- a super-block later (the products and stores of the next super-block issued in between), per activation row:
  its exact integer sum, sum over j of sc_j x C_j[row] (vpmulld and vpaddd: 2 a sub-block), and tiles_k's float
  steps for it and the mins, in tiles_k's order.

The integer sums are the same integers as tiles_k's, the float steps the same operations: the same bits. The rows
past the last multiple of 16 are tiles_k's (Linear._matmul_superblocks).
"""

from __future__ import annotations

import functools

import numpy as np
from gguf import GGMLQuantizationType
from llvmlite import ir
from numba import get_num_threads, njit, prange, types
from numba.core.extending import intrinsic

from miro.core.kernels import amx, cpu
from miro.core.kernels.amx import _tile_product, tile_dpbssd, tile_load, tile_load_config, tile_release, tile_store
from miro.core.kernels.amx import tile_zero
from miro.core.kernels.amx_tiles import ROWS, runs_on
from miro.core.kernels.cache_key import HELPERS, cached_variant
from miro.core.kernels.cpu import Tier
from miro.core.kernels.int8_dots import mins_dot
from miro.core.kernels.quant_blocks import Q4_K, Q5_K, Q6_K, SUPERBLOCK_TYPES
from miro.core.kernels.simd import load16, load16_f16, store16, to_float
from miro.core.kernels.superblock_tiles import LANE_BYTES, k4_tile_pairs
from miro.core.kernels.tile_kernels import _store_tile_row
from miro.core.kernels.tiles import TILE_ROWS

tile_dpbsud = _tile_product("tdpbsud", ("", "u"))
SUB_BLOCKS = {Q4_K: 8, Q5_K: 8, Q6_K: 16}  # sub-blocks (one product each) per super-block
UNPACKED = 256 * TILE_ROWS  # bytes of a super-block's 16 rows, one a value: [quad][lane][row][4 values]


def config(qtype: int) -> np.ndarray:
    """The tile configuration. Q4_K, Q5_K: every tile 16 rows of 64 bytes. Q6_K: C tmm0-3 16 x 16 int32, A tmm4-5
    16 rows of a sub-block's 16 bytes, B tmm6-7 its 4 quads (4 rows of 64 bytes)."""
    if int(qtype) != Q6_K:
        return amx.config_bytes()
    depth = 256 // SUB_BLOCKS[int(qtype)]
    bytes_ = amx.config_bytes()
    bytes_[16:32].view(np.uint16)[4:6] = depth
    bytes_[48 + 6 : 48 + 8] = depth // 4
    return bytes_


def amx_tiles_k(qtype: int, tier: Tier):
    """kernel(quants, scales, mins, sub_scales, a, d, sum32, out, config, threads): tile_kernels.tiles_k's product
    for the first rows of the Q8_K activations a, as many as out has (a multiple of 16); None for other types or
    where it does not run."""
    qtype = int(qtype)
    if qtype not in SUPERBLOCK_TYPES or not runs_on(tier):
        return None
    amx.require()
    if qtype != Q6_K:
        return _amx_digits(qtype, tier)
    has_mins = qtype != Q6_K
    lane_bytes = LANE_BYTES[qtype]
    subs = SUB_BLOCKS[qtype]
    depth = 256 // subs  # values per sub-block: an A tile's bytes per row
    b_bytes = depth * TILE_ROWS  # a B tile's bytes
    c_tile = ROWS * TILE_ROWS  # a C tile's int32
    helpers = HELPERS

    @cached_variant(f"{GGMLQuantizationType(qtype).name}_{tier.name.replace('-', '_')}_amx", parallel=True)
    def matmul_amx_k(quants, scales, mins, sub_scales, a, d, sum32, out, config, threads):
        """out (T16, N) = the tiles of N rows times the first T16 rows of a (T, K) int8 in the values' order
        (quantize_activations.quantize_q8_k); d (T, K / 256), sum32 (T, K / 32)."""
        helpers  # in numba's cache key: see cache_key.py
        n_tok = out.shape[0]
        k = a.shape[1]
        n_super = k // 256
        n_tiles = quants.shape[0]
        # tiles_k's int16 pairs of the activations' 32-value sums, for the mins: [token][pair of sub-blocks]
        sum_pairs = np.empty((n_tok, n_super * 4 if has_mins else 0), np.int32)
        for t in range(n_tok if has_mins else 0):
            for j in range(k // 64):
                sum_pairs[t, j] = (sum32[t, 2 * j] & 0xFFFF) | (sum32[t, 2 * j + 1] << 16)
        a_stride = np.int64(k)
        w_stride = np.int64(64)
        c_stride = np.int64(TILE_ROWS * 4)
        parts = max(1, min(threads, n_tiles))
        for part in prange(parts):
            first, last = part * n_tiles // parts, (part + 1) * n_tiles // parts
            unpacked = np.empty(n_super * UNPACKED, np.uint8)  # the tile's B tiles
            sc = np.empty(n_super * subs * TILE_ROWS, np.int32)  # sub-block j's scales of the 16 rows at 16 j
            pairs = np.empty(n_super * 4 * TILE_ROWS, np.int32)  # Q4_K's, Q5_K's scale pairs (k4_tile_pairs)
            min_pairs = np.empty(n_super * 4 * TILE_ROWS if has_mins else 0, np.int32)
            sums = np.empty(2 * subs * c_tile, np.int32)  # two super-blocks' C tiles, [sub-block][token][row]
            acc = np.empty(ROWS * TILE_ROWS, np.float32)
            acc_mins = np.empty(ROWS * TILE_ROWS, np.float32)
            spill = np.empty(TILE_ROWS, np.float32)
            tile_load_config(config)
            for tile in range(first, last):
                _unpack(qtype, quants[tile], unpacked, n_super, lane_bytes)
                tile_sub_scales = sub_scales[tile]
                for sb in range(n_super):
                    if has_mins:
                        at = 4 * TILE_ROWS * sb
                        k4_tile_pairs(tile_sub_scales, 12 * TILE_ROWS * sb, pairs, at, min_pairs, at)
                        for i in range(4 * TILE_ROWS):  # pair j, row r: sc(2 j) low, sc(2 j + 1) high
                            j, r = i // TILE_ROWS, i % TILE_ROWS
                            sc[(subs * sb + 2 * j) * TILE_ROWS + r] = pairs[at + i] & 0xFFFF
                            sc[(subs * sb + 2 * j + 1) * TILE_ROWS + r] = pairs[at + i] >> 16
                    else:  # Q6_K's int8 scales as the tile holds them: sub-block j's of row r at 16 j + r
                        for i in range(subs * TILE_ROWS):
                            v = np.int32(tile_sub_scales[subs * TILE_ROWS * sb + i])
                            sc[subs * TILE_ROWS * sb + i] = v - ((v >> 7) << 8)
                scale_row, min_row = scales[tile], mins[tile]
                n0 = tile * TILE_ROWS
                for g in range(0, n_tok, ROWS):
                    acc[:] = 0
                    acc_mins[:] = 0
                    for step in range(n_super + 1):
                        if step < n_super:  # super-block `step`'s products into buffer step % 2
                            a_at = np.int64(g) * a_stride + 4096 * step
                            w_at = np.int64(UNPACKED * step)
                            c_at = np.int64(4 * subs * c_tile * (step % 2))
                            for j in range(subs):
                                which = j % 4
                                if which == 0:
                                    tile_zero(0)
                                    tile_load(4, a, a_at + depth * j, a_stride)
                                    tile_load(6, unpacked, w_at + b_bytes * j, w_stride)
                                    if has_mins:
                                        tile_dpbsud(0, 4, 6)
                                    else:
                                        tile_dpbssd(0, 4, 6)
                                    tile_store(0, sums, c_at + 4 * c_tile * j, c_stride)
                                elif which == 1:
                                    tile_zero(1)
                                    tile_load(5, a, a_at + depth * j, a_stride)
                                    tile_load(7, unpacked, w_at + b_bytes * j, w_stride)
                                    if has_mins:
                                        tile_dpbsud(1, 5, 7)
                                    else:
                                        tile_dpbssd(1, 5, 7)
                                    tile_store(1, sums, c_at + 4 * c_tile * j, c_stride)
                                elif which == 2:
                                    tile_zero(2)
                                    tile_load(4, a, a_at + depth * j, a_stride)
                                    tile_load(6, unpacked, w_at + b_bytes * j, w_stride)
                                    if has_mins:
                                        tile_dpbsud(2, 4, 6)
                                    else:
                                        tile_dpbssd(2, 4, 6)
                                    tile_store(2, sums, c_at + 4 * c_tile * j, c_stride)
                                else:
                                    tile_zero(3)
                                    tile_load(5, a, a_at + depth * j, a_stride)
                                    tile_load(7, unpacked, w_at + b_bytes * j, w_stride)
                                    if has_mins:
                                        tile_dpbsud(3, 5, 7)
                                    else:
                                        tile_dpbssd(3, 5, 7)
                                    tile_store(3, sums, c_at + 4 * c_tile * j, c_stride)
                        if step >= 1:  # super-block step - 1: its integer sums and float steps, row after row
                            sb = step - 1
                            base = subs * c_tile * (sb % 2)
                            s_at = subs * TILE_ROWS * sb
                            dw = load16_f16(scale_row, TILE_ROWS * sb)
                            for t in range(ROWS):
                                at = TILE_ROWS * t
                                total = _isum(sums, base + at, sc, s_at, subs, c_tile)
                                store16(acc, at, load16(acc, at) + (dw * d[g + t, sb]) * to_float(total))
                            if has_mins:
                                dmin = load16_f16(min_row, TILE_ROWS * sb)
                                for t in range(ROWS):
                                    sum_mins = mins_dot(min_pairs, sb * 4 * TILE_ROWS, sum_pairs[g + t], 4 * sb, 512, 4)
                                    at = TILE_ROWS * t
                                    store16(
                                        acc_mins, at, load16(acc_mins, at) + (dmin * d[g + t, sb]) * to_float(sum_mins)
                                    )
                    for t in range(ROWS):
                        at = TILE_ROWS * t
                        total = load16(acc, at) - load16(acc_mins, at) if has_mins else load16(acc, at)
                        _store_tile_row(out, g + t, n0, total, spill)
            tile_release()
        return out

    return matmul_amx_k


DIGIT_SHIFT = {Q4_K: 4, Q5_K: 3}  # a scale's high digit's weight, 2^shift: the low digit < 2^shift
DIGIT_BYTES = 3 * UNPACKED  # a super-block's B tiles: low digits, high digits, mins; each [chunk][16 rows x 4][row]


def _amx_digits(qtype: int, tier: Tier):
    """Q4_K, Q5_K: the sub-block scales folded into the weights. sc = 2^shift hi + lo (Q4_K: 16 hi + lo, lo < 16;
    Q5_K: 8 hi + lo, lo < 8), so that q x lo and q x hi fit a byte (at most 15 x 15, 31 x 7): per super-block,
    row and token, sum over v of q_v sc_j(v) a_v = 2^shift C_hi + C_lo, C_hi and C_lo TDPBSUDs over the whole
    super-block (4 of 64 values each) against weights q x hi and q x lo; the mins' sum, sum over sub-blocks of
    m_j x (the activations' 32-value sum j), is a third, against weights m_j(v). Exact integers, tiles_k's own:
    per super-block 12 TDPBSUD and 3 tile stores, and per token 2 loads, a shift and an add for the sum, 1 load for
    the mins' sum, then tiles_k's float steps."""
    shift = DIGIT_SHIFT[qtype]
    lane_bytes = LANE_BYTES[qtype]
    helpers = HELPERS

    @cached_variant(f"{GGMLQuantizationType(qtype).name}_{tier.name.replace('-', '_')}_amx", parallel=True)
    def matmul_amx_k(quants, scales, mins, sub_scales, a, d, sum32, out, config, threads):
        """out (T16, N) = the tiles of N rows times the first T16 rows of a (T, K) int8 in the values' order
        (quantize_activations.quantize_q8_k); d (T, K / 256); sum32 unused (the mins' sums are a product)."""
        helpers  # in numba's cache key: see cache_key.py
        n_tok = out.shape[0]
        k = a.shape[1]
        n_super = k // 256
        n_tiles = quants.shape[0]
        a_stride = np.int64(k)
        w_stride = np.int64(64)
        c_stride = np.int64(TILE_ROWS * 4)
        c_tile = ROWS * TILE_ROWS
        # the activations' A tiles, each 16 rows of 64 bytes in a row, [16 rows][chunk of 64]: rows k bytes apart
        # put a tile's 16 lines in two L1 sets for k a multiple of 2048
        packed = np.empty(n_tok * k, np.int8)
        for t in range(n_tok):
            row = a[t]
            at = (t - t % ROWS) * k + 64 * (t % ROWS)
            for chunk in range(k // 64):
                for i in range(64):
                    packed[at + 1024 * chunk + i] = row[64 * chunk + i]
        parts = max(1, min(threads, n_tiles))
        for part in prange(parts):
            first, last = part * n_tiles // parts, (part + 1) * n_tiles // parts
            digits = np.empty(2 * DIGIT_BYTES, np.uint8)  # two super-blocks' B tiles, in turn
            pairs = np.empty(4 * TILE_ROWS, np.int32)
            min_pairs = np.empty(4 * TILE_ROWS, np.int32)
            sums = np.empty(2 * 3 * c_tile, np.int32)  # two products' C tiles in turn: C_lo, C_hi, C_mins [token][row]
            acc = np.empty(n_tok * TILE_ROWS, np.float32)  # every token's float sums, [token][row]
            acc_mins = np.empty(n_tok * TILE_ROWS, np.float32)
            spill = np.empty(TILE_ROWS, np.float32)
            tile_load_config(config)
            for tile in range(first, last):
                tile_quants, tile_sub_scales = quants[tile], sub_scales[tile]
                scale_row, min_row = scales[tile], mins[tile]
                acc[:] = 0
                acc_mins[:] = 0
                done = 0  # products made: the one before is scaled after each
                for sb in range(n_super):  # a super-block's B tiles stay in L1 over the token groups
                    k4_tile_pairs(tile_sub_scales, 12 * TILE_ROWS * sb, pairs, 0, min_pairs, 0)
                    w_at = np.int64(DIGIT_BYTES * (sb % 2))
                    digit_tiles(tile_quants, 8 * lane_bytes * sb, pairs, min_pairs, digits, w_at, qtype, shift)
                    for g in range(0, n_tok, ROWS):  # its three products, stored in buffer `done % 2`
                        a_at = np.int64(g) * a_stride + 4096 * sb
                        c_at = np.int64(4 * 3 * c_tile * (done % 2))
                        tile_zero(0)
                        tile_zero(1)
                        tile_zero(2)
                        for c in range(4):
                            tile_load(3, packed, a_at + 1024 * c, w_stride)
                            tile_load(4, digits, w_at + 1024 * c, w_stride)
                            tile_dpbsud(0, 3, 4)
                            tile_load(5, digits, w_at + UNPACKED + 1024 * c, w_stride)
                            tile_dpbsud(1, 3, 5)
                            tile_load(6, digits, w_at + 2 * UNPACKED + 1024 * c, w_stride)
                            tile_dpbsud(2, 3, 6)
                        tile_store(0, sums, c_at, c_stride)
                        tile_store(1, sums, c_at + 4 * c_tile, c_stride)
                        tile_store(2, sums, c_at + 8 * c_tile, c_stride)
                        if done:  # the product before, its float steps (its store's latency behind this product)
                            before = g - ROWS if g else n_tok - ROWS
                            _float_steps(sums, (done - 1) % 2, acc, acc_mins, before, sb - (g == 0), scale_row, min_row, d, shift)
                        done += 1
                _float_steps(sums, (done - 1) % 2, acc, acc_mins, n_tok - ROWS, n_super - 1, scale_row, min_row, d, shift)
                n0 = tile * TILE_ROWS
                for t in range(n_tok):
                    at = TILE_ROWS * t
                    _store_tile_row(out, t, n0, load16(acc, at) - load16(acc_mins, at), spill)
            tile_release()
        return out

    return matmul_amx_k


@njit(inline="always")
def _float_steps(sums, buffer, acc, acc_mins, g, sb, scale_row, min_row, d, shift):
    """tiles_k's float steps of super-block sb for tokens g.. g + 15 from their C tiles in `sums` buffer `buffer`:
    the integer sum 2^shift C_hi + C_lo, the mins' C_mins."""
    c_tile = ROWS * TILE_ROWS
    base = 3 * c_tile * buffer
    dw = load16_f16(scale_row, TILE_ROWS * sb)
    for t in range(ROWS):
        at = TILE_ROWS * t
        total = load16(sums, base + c_tile + at) * (1 << shift) + load16(sums, base + at)
        row = TILE_ROWS * (g + t)
        store16(acc, row, load16(acc, row) + (dw * d[g + t, sb]) * to_float(total))
    dmin = load16_f16(min_row, TILE_ROWS * sb)
    for t in range(ROWS):
        at = TILE_ROWS * t
        row = TILE_ROWS * (g + t)
        sum_mins = load16(sums, base + 2 * c_tile + at)
        store16(acc_mins, row, load16(acc_mins, row) + (dmin * d[g + t, sb]) * to_float(sum_mins))


@intrinsic(prefer_literal=True)
def digit_tiles(typingctx, quants, q_at, pairs, min_pairs, digits, d_at, qtype, shift):
    """A Q4_K or Q5_K tile's super-block at quants[q_at:] (superblock_tiles.py, the values' order) as its B tiles
    at digits[d_at:]: quad Q lane l (64 bytes, [row r][4 values]) at 512 Q + 64 l, value x (sc_r & (2^shift - 1));
    UNPACKED further on value x (sc_r >> shift); 2 UNPACKED further on m_r; sc_r, m_r row r's scale and min of
    sub-block Q from k4_tile_pairs' pairs and min_pairs (sub-block 2 j's the low int16 at 16 j + r, 2 j + 1's
    the high). The products by vpmullw on byte pairs of one row: each < 256, so no carry between them."""
    if not all(isinstance(ty, types.IntegerLiteral) for ty in (qtype, shift)):
        return None
    fifth_bits = qtype.literal_value == Q5_K
    bits = shift.literal_value

    def codegen(context, builder, signature, args):
        i8, i16, i32, i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
        d16, w16, w32, b16, b64 = (
            ir.VectorType(i32, 16),
            ir.VectorType(i16, 16),
            ir.VectorType(i16, 32),
            ir.VectorType(i8, 16),
            ir.VectorType(i8, 64),
        )

        def data(index):
            return context.make_array(signature.args[index])(context, builder, args[index]).data

        def pointer(base, at, offset, vector_type):
            where = builder.gep(base, [builder.add(at, ir.Constant(i64, offset))])
            return builder.bitcast(where, vector_type.as_pointer())

        def splat_bytes(value):
            return ir.Constant(b64, [value] * 64)

        zero = ir.Constant(i64, 0)
        by_pairs = ir.Constant(ir.VectorType(i32, 32), [i // 2 for i in range(32)])
        by_fours = ir.Constant(ir.VectorType(i32, 64), [i // 4 for i in range(64)])
        src, dst = data(0), data(4)
        for c in range(4):  # vector c: quad 2 c in its low nibbles, 2 c + 1 in its high ones; pair c their scales
            scale_pair = builder.load(pointer(data(2), zero, 16 * c, d16), align=4)
            min_pair = builder.load(pointer(data(3), zero, 16 * c, d16), align=4)
            factors = []
            for h in range(2):
                scales = builder.lshr(scale_pair, ir.Constant(d16, [16 * h] * 16))
                scales = builder.and_(scales, ir.Constant(d16, [0xFFFF] * 16))
                low = builder.trunc(builder.and_(scales, ir.Constant(d16, [(1 << bits) - 1] * 16)), w16)
                high = builder.trunc(builder.lshr(scales, ir.Constant(d16, [bits] * 16)), w16)
                mins = builder.trunc(builder.lshr(min_pair, ir.Constant(d16, [16 * h] * 16)), b16)
                factors.append(
                    (
                        builder.shuffle_vector(low, ir.Constant(w16, None), by_pairs),
                        builder.shuffle_vector(high, ir.Constant(w16, None), by_pairs),
                        builder.shuffle_vector(mins, ir.Constant(b16, None), by_fours),
                    )
                )
            for lane in range(8):
                packed = builder.load(pointer(src, args[1], 512 * c + 64 * lane, b64), align=1)
                values = [builder.and_(packed, splat_bytes(15)), builder.lshr(packed, splat_bytes(4))]
                if fifth_bits:  # vector 4: bit Q of each byte quad Q's 5th bit
                    fifth = builder.load(pointer(src, args[1], 2048 + 64 * lane, b64), align=1)
                    for h in range(2):
                        bit = builder.and_(builder.lshr(fifth, splat_bytes(2 * c + h)), splat_bytes(1))
                        values[h] = builder.or_(values[h], builder.shl(bit, splat_bytes(4)))
                for h in range(2):
                    low, high, mins = factors[h]
                    words = builder.bitcast(values[h], w32)
                    quad_at = 512 * (2 * c + h) + 64 * lane
                    builder.store(builder.mul(words, low), pointer(dst, args[5], quad_at, w32), align=1)
                    builder.store(builder.mul(words, high), pointer(dst, args[5], UNPACKED + quad_at, w32), align=1)
                    builder.store(mins, pointer(dst, args[5], 2 * UNPACKED + quad_at, b64), align=1)
        return context.get_dummy_value()

    return types.void(quants, types.intp, pairs, min_pairs, digits, types.intp, qtype, shift), codegen


@njit(inline="always")
def _isum(sums, at, sc, s_at, subs, c_tile):
    """One activation row's super-block sums for the 16 weight rows: sum over sub-blocks j of sc_j x C_j[row]."""
    total = load16(sc, s_at) * load16(sums, at)
    for j in range(1, subs):
        total = total + load16(sc, s_at + TILE_ROWS * j) * load16(sums, at + c_tile * j)
    return total


@njit(inline="always")
def _unpack(qtype, tile_quants, unpacked, n_super, lane_bytes):
    """A tile's quants (superblock_tiles.py, the values' order) one byte a value, as B tiles: super-block sb's quad Q
    at UNPACKED sb + 512 Q, [lane][row][4 values] (sub-block Q of Q4_K, Q5_K: 8 B rows; Q6_K's 16-value sub-blocks
    2 Q, 2 Q + 1 its lanes 0-3 and 4-7: 4 B rows each), Q6_K's as q - 32 (int8 bits)."""
    for sb in range(n_super):
        src = 8 * lane_bytes * sb
        dst = UNPACKED * sb
        for c in range(4):  # vector c: quad 2 c's values in its low nibbles, 2 c + 1's in its high ones
            low_at, high_at = dst + 1024 * c, dst + 1024 * c + 512
            v_at = src + 512 * c
            if qtype == Q4_K:
                for j in range(512):
                    v = tile_quants[v_at + j]
                    unpacked[low_at + j] = v & 15
                    unpacked[high_at + j] = v >> 4
            elif qtype == Q5_K:  # vector 4: bit Q of each byte quad Q's 5th bit
                for j in range(512):
                    v = tile_quants[v_at + j]
                    bits = tile_quants[src + 2048 + j] >> (2 * c)
                    unpacked[low_at + j] = (v & 15) | ((bits & 1) << 4)
                    unpacked[high_at + j] = (v >> 4) | ((bits & 2) << 3)
            else:  # vector 4 + c // 2: bits 2 q, 2 q + 1 of each byte quad 4 (c // 2) + q's 5th and 6th
                shift = 4 * (c % 2)
                for j in range(512):
                    v = tile_quants[v_at + j]
                    bits = tile_quants[src + 2048 + 512 * (c // 2) + j] >> shift
                    unpacked[low_at + j] = ((v & 15) | ((bits & 3) << 4)) + 224  # q - 32 mod 256
                    unpacked[high_at + j] = ((v >> 4) | ((bits & 12) << 2)) + 224


@functools.cache
def kernel(qtype: int, tier_name: str):
    """amx_tiles_k's kernel for a type on a tier (by name), made once per process."""
    return amx_tiles_k(qtype, cpu.get(tier_name))


@functools.cache
def _config(qtype: int) -> np.ndarray:
    return config(qtype)


def matmul(kernel, qtype: int, tiles, a, out: np.ndarray) -> np.ndarray:
    """out (T16, N) = tiles (superblock_tiles.py, the values' order) times the first T16 rows of the Q8_K
    activations a (Q8KBlocks, quantize_q8_k)."""
    return kernel(
        tiles.quants,
        tiles.scales,
        tiles.mins,
        tiles.sub_scales,
        a.q,
        a.d,
        a.sum32,
        out,
        _config(int(qtype)),
        get_num_threads(),
    )
