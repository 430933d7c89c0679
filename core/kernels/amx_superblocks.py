"""The K-quant tile kernel's integer dots on AMX (amx.py): Q4_K, Q5_K and Q6_K tiles (superblock_tiles.py, in the
values' order of 512-bit VNNI tiers) times 16 activation rows at a time, each super-block's exact int32 sums per
(token, weight row) by TDPBxxD, then superblock_kernels.tiles_k's float steps: the same integers, the same float
operations in the same order, so the same bits.

tiles_k on those tiers (superblock_dots.superblock_unit_vnni) builds sum over the values v of q_v sc_j(v) a_v (sc_j the
sub-block's scale) by vpdpbusd and vpdpwssd: about 117 instructions per super-block, 16 weight rows and token.
TDPBxxD has no per-sub-block scale, and one product per sub-block (16 x 16 x 32, Q6_K's x 16) would leave a
store, a load, a vpmulld and a vpaddd per sub-block and token (measured about the VNNI kernel's time). Here the
scales go into the weights instead, split into two digits small enough to fit a byte:

- Q4_K: sc (< 64) = 16 hi + lo, q x lo <= 15 x 15 and q x hi <= 15 x 3; Q5_K: sc = 8 hi + lo, q x lo and q x hi
  <= 31 x 7 (unsigned, TDPBSUD), so sum q sc a = 2^shift C_hi + C_lo; the mins' sum M = sum over the sub-blocks j
  of m_j x S_j (S_j the activations' 32-value sum) by one TDPBF16PS a super-block: each S_j as the pair
  (S_j mod 32, S_j - S_j mod 32), both exact in bfloat16 (|S_j| <= 32 x 127), against (m_j, m_j) (m_j < 64): every
  product and partial sum an integer below 2^24, so the float32 M is exactly the int32 that tiles_k's vpmaddwd make
  (superblock_dots.mins_dot). Those vpmaddwd, done in the float steps here before, cost 5-10% of a 512-row call
  (the vector work, not the tiles, sets this kernel's speed); as an int8 product against weights m_j(v) they cost
  4 more TDPBxxD of 64 deep and gained nothing;
- Q6_K: the product w = (q - 32) sc itself (|w| <= 4096) = 256 hi + lo, lo its low byte (unsigned, TDPBSUD),
  hi its high one (signed, TDPBSSD), so sum (q - 32) sc a = 256 C_hi + C_lo (tiles_k's Q6_K sum, offset
  included). (Three base-8 digits of sc, each times q - 32, took 12 products and half again the vector work.)

Per tile of 16 weight rows and super-block its two B-tile sets (2 x 4 KB, `digit_tiles`: vpmullw on byte pairs;
`q6_k_digit_tiles`: vpmaddubsw and a byte shuffle per digit) are made once, then used by every 16 activation rows
of a block of up to 256 (TOKEN_BLOCK, BLOCK_BYTES: its activations stay in L2 while the part's tiles pass; A: the
Q8_K activations, repacked once per call so that each A tile's 16 rows of 64 bytes lie in a row): 8 TDPBxxD over
the super-block's 4 chunks of 64 values (and the mins' TDPBF16PS, 16 deep, from `_sum_tiles` and
`mins_bf16_tile`) and 2 (3) tile stores; a product later (its stores' latency behind the next), per token, a
shift and an add and the float steps. Q4_K and Q5_K take it where AMX-BF16 runs too (every AMX CPU so far). Rows
past the last multiple of 16, and calls of fewer than the table's `amx_from` rows (32), whose digits would be made
for too few tokens to pay, are tiles_k's (Linear._matmul_superblocks).
"""

from __future__ import annotations

import functools

import numpy as np
from gguf import GGMLQuantizationType
from llvmlite import ir
from numba import get_num_threads, njit, prange, types
from numba.core import cgutils
from numba.core.extending import intrinsic

from miro.core.kernels import amx, amx_bf16, cpu
from miro.core.kernels.amx import tile_dpbf16ps, tile_dpbs, tile_dpbsud, tile_load, tile_load_config, tile_release
from miro.core.kernels.amx import aligned, tile_store, tile_zero
from miro.core.kernels.amx_tiles import ROWS, runs_on
from miro.core.kernels.cache_key import HELPERS, cached_variant
from miro.core.kernels.cpu import Tier
from miro.core.kernels.quant_blocks import Q4_K, Q5_K, Q6_K, SUPERBLOCK_TYPES
from miro.core.kernels.simd import load16, load16_f16, store16, to_float
from miro.core.kernels.superblock_tiles import LANE_BYTES, k4_tile_pairs
from miro.core.kernels.tile_steps import store_tile_row
from miro.core.kernels.tiles import TILE_ROWS

TOKEN_BLOCK = 256  # at most the activation rows a part takes over all its tiles before the next,
BLOCK_BYTES = 1 << 20  # and at most this many of their bytes: they stay in L2 (256 x 8192 bytes cost 8-22% more)
UNPACKED = 256 * TILE_ROWS  # bytes of one B-tile set of a super-block: [chunk of 64 values][16 x 4 values][row]
DIGIT_BYTES = 2 * UNPACKED  # a super-block's two B-tile sets
DIGIT_SHIFT = {Q4_K: 4, Q5_K: 3, Q6_K: 8}  # Q4_K's, Q5_K's scale digits: sc = 2^shift hi + lo; Q6_K's w = 256 hi + lo
MINS_TILE = 8 * TILE_ROWS  # words of a super-block's mins B tile: 8 sub-blocks x 16 rows of (m_j, m_j) bf16 pairs
SUMS_TILE = 512  # bytes of an A tile of sub-block sums: 16 tokens x 16 bfloat16 (a super-block's 8 pairs)


def amx_tiles_k(qtype: int, tier: Tier):
    """kernel(quants, scales, mins, sub_scales, a, d, sum32, out, config, threads): superblock_kernels.tiles_k's product
    for the first rows of the Q8_K activations a (quantize_q8_k), as many as out has (a multiple of 16); None for
    other types or where it does not run."""
    qtype = int(qtype)
    has_mins = qtype != Q6_K
    signed_high = not has_mins  # Q6_K's high byte of (q - 32) sc
    if qtype not in SUPERBLOCK_TYPES or not runs_on(tier) or (has_mins and not amx_bf16.ready()):
        return None
    amx.require()
    shift = DIGIT_SHIFT[qtype]
    lane_bytes = LANE_BYTES[qtype]
    helpers = HELPERS

    @cached_variant(f"{GGMLQuantizationType(qtype).name}_{tier.name.replace('-', '_')}_amx", parallel=True)
    def matmul_amx_k(quants, scales, mins, sub_scales, a, d, sum32, out, config, threads):
        """out (T16, N) = the tiles of N rows times the first T16 rows of a (T, K) int8 in the values' order; d
        (T, K / 256); sum32 (T, K / 32) the 32-value sums, for the mins."""
        helpers  # in numba's cache key: see cache_key.py
        n_tok = out.shape[0]
        k = a.shape[1]
        n_super = k // 256
        n_tiles = quants.shape[0]
        a_stride = np.int64(k)
        w_stride = np.int64(64)
        c_stride = np.int64(TILE_ROWS * 4)
        c_tile = ROWS * TILE_ROWS
        packed = _a_tiles(a, n_tok)
        sum_tiles = _sum_tiles(sum32, n_tok if has_mins else 0)
        s_stride = np.int64(2 * TILE_ROWS)  # bytes of an A tile row of sums
        parts = max(1, min(threads, n_tiles))
        token_block = max(ROWS, min(TOKEN_BLOCK, BLOCK_BYTES // k // ROWS * ROWS))
        # each part's scratch; the tiles' buffers on cache lines (a tile row of 64 bytes in one line, not two)
        scratch_bytes = 2 * DIGIT_BYTES + 2 * 4 * MINS_TILE + 4 * 3 * 2 * c_tile
        all_scratch = aligned(parts * scratch_bytes)
        all_pairs = np.empty((parts, 3, 4 * TILE_ROWS), np.int32)
        acc_bytes = 2 * token_block * TILE_ROWS * 4  # on cache lines, as every 64-byte load and store of them
        all_acc = aligned(parts * acc_bytes).view(np.float32).reshape((parts, 2, token_block * TILE_ROWS))
        all_spill = np.empty((parts, TILE_ROWS), np.float32)
        for part in prange(parts):
            first, last = part * n_tiles // parts, (part + 1) * n_tiles // parts
            scratch = all_scratch[part * scratch_bytes : (part + 1) * scratch_bytes]
            digits = scratch[: 2 * DIGIT_BYTES]  # two super-blocks' B tiles, in turn
            mins_tiles = scratch[2 * DIGIT_BYTES : 2 * DIGIT_BYTES + 8 * MINS_TILE].view(np.uint32)  # two, in turn
            # two products' three C tiles, in turn, [token][row]: the digits' int32 sums, the mins' float32 ones
            sums = scratch[2 * DIGIT_BYTES + 8 * MINS_TILE :].view(np.int32)
            min_sums = scratch[2 * DIGIT_BYTES + 8 * MINS_TILE :].view(np.float32)
            # Q4_K's, Q5_K's (k4_tile_pairs); the mins' pairs of two super-blocks in turn
            pairs, min_pairs = all_pairs[part, 0], all_pairs[part, 1:].reshape(8 * TILE_ROWS)
            acc = all_acc[part, 0]  # a block of tokens' float sums, [token][row]
            acc_mins = all_acc[part, 1] if has_mins else all_acc[part, 1, :0]
            spill = all_spill[part]
            tile_load_config(config)
            for t0 in range(0, n_tok, token_block):  # its activations stay in L2 over the part's tiles
                t1 = min(n_tok, t0 + token_block)
                for tile in range(first, last):
                    tile_quants, tile_sub_scales = quants[tile], sub_scales[tile]
                    scale_row, min_row = scales[tile], mins[tile]
                    acc[:] = 0
                    acc_mins[:] = 0
                    done = 0  # products made: the one before is scaled after each
                    for sb in range(n_super):  # a super-block's B tiles stay in L1 over the token groups
                        w_at = np.int64(DIGIT_BYTES * (sb % 2))
                        if has_mins:
                            k4_tile_pairs(tile_sub_scales, 12 * TILE_ROWS * sb, pairs, 0, min_pairs, 64 * (sb % 2))
                            digit_tiles(tile_quants, 8 * lane_bytes * sb, pairs, digits, w_at, qtype, shift)
                            mins_bf16_tile(min_pairs, 64 * (sb % 2), mins_tiles, MINS_TILE * (sb % 2))
                        else:
                            q6_k_digit_tiles(tile_quants, 8 * lane_bytes * sb, tile_sub_scales, 256 * sb, digits, w_at)
                        for g in range(t0, t1, ROWS):  # its products for 16 tokens, in buffer `done % 2`
                            a_at = np.int64(g) * a_stride + 4096 * sb
                            c_at = np.int64(4 * 3 * c_tile * (done % 2))
                            tile_zero(0)
                            tile_zero(1)
                            if has_mins:  # the mins' sums: A the 16 tokens' sub-block sums, B the mins
                                tile_zero(2)
                                tile_load(6, sum_tiles, (np.int64(g // ROWS) * n_super + sb) * SUMS_TILE, s_stride)
                                tile_load(7, mins_tiles, np.int64(4 * MINS_TILE * (sb % 2)), w_stride)
                                tile_dpbf16ps(2, 6, 7)
                            for c in range(4):
                                tile_load(3, packed, a_at + 1024 * c, w_stride)
                                tile_load(4, digits, w_at + 1024 * c, w_stride)
                                tile_dpbsud(0, 3, 4)  # low digits: unsigned
                                tile_load(5, digits, w_at + UNPACKED + 1024 * c, w_stride)
                                tile_dpbs(1, 3, 5, signed_high)  # high digits: Q6_K's signed
                            tile_store(0, sums, c_at, c_stride)
                            tile_store(1, sums, c_at + 4 * c_tile, c_stride)
                            if has_mins:
                                tile_store(2, sums, c_at + 8 * c_tile, c_stride)
                            if done:  # the product before: its float steps (its stores' latency behind this one)
                                before, before_sb = (g - ROWS, sb) if g > t0 else (t1 - ROWS, sb - 1)
                                _float_steps(
                                    sums,
                                    (done - 1) % 2,
                                    acc,
                                    acc_mins,
                                    before,
                                    t0,
                                    before_sb,
                                    scale_row,
                                    min_row,
                                    min_sums,
                                    d,
                                    shift,
                                    has_mins,
                                )
                            done += 1
                    _float_steps(
                        sums,
                        (done - 1) % 2,
                        acc,
                        acc_mins,
                        t1 - ROWS,
                        t0,
                        n_super - 1,
                        scale_row,
                        min_row,
                        min_sums,
                        d,
                        shift,
                        has_mins,
                    )
                    n0 = tile * TILE_ROWS
                    for t in range(t0, t1):
                        at = TILE_ROWS * (t - t0)
                        total = load16(acc, at) - load16(acc_mins, at) if has_mins else load16(acc, at)
                        store_tile_row(out, t, n0, total, spill)
            tile_release()
        return out

    return matmul_amx_k


@njit(cache=True)
def _a_tiles(a, n_tok):
    """The first n_tok rows of a (T, K) int8 as A tiles, [16 rows][chunk of 64 values][row][64 bytes], each 1 KB
    in a row: rows K bytes apart put a tile's 16 lines in two L1 sets for K a multiple of 2048. Copied 8 bytes at a
    time (a byte loop took about 10% of a 16-row call)."""
    k = a.shape[1]
    packed = aligned(n_tok * k).view(np.int64)
    for t in range(n_tok):
        words = a[t].view(np.int64)
        at = ((t - t % ROWS) * k + 64 * (t % ROWS)) // 8
        for chunk in range(k // 64):
            for i in range(8):
                packed[at + 128 * chunk + i] = words[8 * chunk + i]
    return packed.view(np.int8)


def _bf16_bits(values) -> np.ndarray:
    """The bfloat16 bits of integers that bfloat16 holds exactly."""
    return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)


SUM_LOW_BF16 = _bf16_bits(np.arange(32))  # S mod 32
SUM_HIGH_BF16 = _bf16_bits(32 * np.arange(-128, 129))  # S - S mod 32 = 32 h, h from -128


@njit(cache=True)
def _sum_tiles(sum32, n_tok):
    """The first n_tok rows' 32-value sums S_j (sum32, (T, K / 32)) as bfloat16 A tiles, [16 tokens][super-block]
    [token][16 bfloat16]: sub-block j's S_j as the pair (S_j mod 32, S_j - S_j mod 32) at 2 j, 2 j + 1, each
    exact in bfloat16 (a value below 32, or 32 times one of 8 bits; |S_j| <= 32 x 128), whose sum is S_j. Tokens
    past n_tok: zero."""
    n_super = sum32.shape[1] // 8
    tiles = aligned(((n_tok + ROWS - 1) // ROWS * ROWS) * n_super * SUMS_TILE // ROWS).view(np.uint16)  # lines
    tiles[:] = 0
    for t in range(n_tok):
        for sb in range(n_super):
            at = ((t // ROWS * n_super + sb) * ROWS + t % ROWS) * 16
            for j in range(8):
                s = sum32[t, 8 * sb + j]
                tiles[at + 2 * j] = SUM_LOW_BF16[s & 31]
                tiles[at + 2 * j + 1] = SUM_HIGH_BF16[(s >> 5) + 128]
    return tiles


@intrinsic
def mins_bf16_tile(typingctx, min_pairs, at, out, out_at):
    """A super-block's mins for the 16 rows of a tile as a TDPBF16PS B tile: from k4_tile_pairs' min_pairs[at + 16 p
    + r] (row r's 6-bit mins of sub-blocks 2 p, the low int16, and 2 p + 1), out[out_at + 16 j + r] = the bfloat16
    pair (m_j, m_j) of row r (exact: m_j < 64)."""

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        d16 = ir.VectorType(i32, 16)
        data = functools.partial(_array_data, context, builder, signature, args)
        pointer = functools.partial(_vector_pointer, builder)

        def splat(value):
            return ir.Constant(d16, [value] * 16)

        for p in range(4):
            pair = builder.load(pointer(data(0), args[1], 16 * p, d16), align=4)
            for h in range(2):  # sub-block 2 p + h
                mins = builder.and_(builder.lshr(pair, splat(16 * h)), splat(0xFFFF))
                bits = builder.bitcast(builder.sitofp(mins, ir.VectorType(ir.FloatType(), 16)), d16)
                both = builder.or_(builder.and_(bits, splat(0xFFFF0000)), builder.lshr(bits, splat(16)))
                builder.store(both, pointer(data(2), args[3], 16 * (2 * p + h), d16), align=4)
        return context.get_dummy_value()

    return types.void(min_pairs, types.intp, out, types.intp), codegen


@njit(inline="always")
def _float_steps(sums, buffer, acc, acc_mins, g, t0, sb, scale_row, min_row, min_sums, d, shift, has_mins):
    """tiles_k's float steps of super-block sb for tokens g.. g + 15 (in acc from t0) from their C tiles in `sums`
    buffer `buffer`: the integer sum 2^shift C_hi + C_lo (Q6_K's shift 8); Q4_K's, Q5_K's (has_mins) mins' sum, an
    integer in float32, from the third C tile (min_sums: the same bytes). (Unsigned token indices: no negative-index
    wraparound.)"""
    c_tile = ROWS * TILE_ROWS
    base = 3 * c_tile * buffer
    dw = load16_f16(scale_row, TILE_ROWS * sb)
    for t in range(ROWS):
        at = TILE_ROWS * t
        total = load16(sums, base + c_tile + at) * (1 << shift) + load16(sums, base + at)
        row = TILE_ROWS * (g - t0 + t)
        store16(acc, row, load16(acc, row) + (dw * d[np.uint64(g + t), sb]) * to_float(total))
    if has_mins:
        dmin = load16_f16(min_row, TILE_ROWS * sb)
        for t in range(ROWS):
            at = TILE_ROWS * t
            row = TILE_ROWS * (g - t0 + t)
            sum_mins = load16(min_sums, base + 2 * c_tile + at)
            store16(acc_mins, row, load16(acc_mins, row) + (dmin * d[np.uint64(g + t), sb]) * sum_mins)


@intrinsic(prefer_literal=True)
def digit_tiles(typingctx, quants, q_at, pairs, digits, d_at, qtype, shift):
    """A Q4_K or Q5_K tile's super-block at quants[q_at:] (superblock_tiles.py, the values' order) as its B tiles
    at digits[d_at:]: quad Q lane l (64 bytes, [row r][4 values]) at 512 Q + 64 l, value x (sc_r & (2^shift - 1));
    UNPACKED further on value x (sc_r >> shift); sc_r row r's scale of sub-block Q from k4_tile_pairs' pairs
    (sub-block 2 j's the low int16 at 16 j + r, 2 j + 1's the high). The products by vpmullw on byte pairs of one row: each < 256, so no carry between them."""
    if not all(isinstance(ty, types.IntegerLiteral) for ty in (qtype, shift)):
        return None
    fifth_bits = qtype.literal_value == Q5_K
    bits = shift.literal_value

    def codegen(context, builder, signature, args):
        i8, i16, i32, i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
        d16, w16, w32, b64 = (
            ir.VectorType(i32, 16),
            ir.VectorType(i16, 16),
            ir.VectorType(i16, 32),
            ir.VectorType(i8, 64),
        )

        data = functools.partial(_array_data, context, builder, signature, args)
        pointer = functools.partial(_vector_pointer, builder)

        def splat_bytes(value):
            return ir.Constant(b64, [value] * 64)

        zero = ir.Constant(i64, 0)
        by_pairs = ir.Constant(ir.VectorType(i32, 32), [i // 2 for i in range(32)])
        src, dst = data(0), data(3)
        for c in range(4):  # vector c: quad 2 c in its low nibbles, 2 c + 1 in its high ones; pair c their scales
            scale_pair = builder.load(pointer(data(2), zero, 16 * c, d16), align=4)
            factors = []
            for h in range(2):
                scales = builder.lshr(scale_pair, ir.Constant(d16, [16 * h] * 16))
                scales = builder.and_(scales, ir.Constant(d16, [0xFFFF] * 16))
                low = builder.trunc(builder.and_(scales, ir.Constant(d16, [(1 << bits) - 1] * 16)), w16)
                high = builder.trunc(builder.lshr(scales, ir.Constant(d16, [bits] * 16)), w16)
                factors.append(
                    (
                        builder.shuffle_vector(low, ir.Constant(w16, None), by_pairs),
                        builder.shuffle_vector(high, ir.Constant(w16, None), by_pairs),
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
                    low, high = factors[h]
                    words = builder.bitcast(values[h], w32)
                    quad_at = 512 * (2 * c + h) + 64 * lane
                    builder.store(builder.mul(words, low), pointer(dst, args[4], quad_at, w32), align=1)
                    builder.store(builder.mul(words, high), pointer(dst, args[4], UNPACKED + quad_at, w32), align=1)
        return context.get_dummy_value()

    return types.void(quants, types.intp, pairs, digits, types.intp, qtype, shift), codegen


@intrinsic
def q6_k_digit_tiles(typingctx, quants, q_at, sub_scales, s_at, digits, d_at):
    """A Q6_K tile's super-block at quants[q_at:] (the values' order) as its B tiles at digits[d_at:]: quad Q lane l
    (64 bytes, [row r][4 values]) at 512 Q + 64 l the low byte (unsigned) of w = (q - 32) x sc_r, UNPACKED further
    on its high byte (signed, w >> 8 in -16..16), sc_r row r's int8 scale of 16-value sub-block 2 Q + l // 4
    (sub_scales[s_at + 16 j + r]): w = lo + 256 hi, |w| <= 4096. w by vpmaddubsw of the 6-bit q (unsigned) by sc
    in the even or the odd byte of each pair, less 32 sc; the two bytes of the even and odd values' words by one
    byte shuffle each."""

    def codegen(context, builder, signature, args):
        i8, i16, i32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
        w16, w32, b16, b64 = (
            ir.VectorType(i16, 16),
            ir.VectorType(i16, 32),
            ir.VectorType(i8, 16),
            ir.VectorType(i8, 64),
        )

        data = functools.partial(_array_data, context, builder, signature, args)
        pointer = functools.partial(_vector_pointer, builder)

        def splat(vector_type, value):
            return ir.Constant(vector_type, [value] * vector_type.count)

        def maddubs(unsigned, signed):
            function = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(w32, [b64, b64]), "llvm.x86.avx512.pmaddubs.w.512"
            )
            return builder.call(function, [unsigned, signed])

        by_pairs = ir.Constant(ir.VectorType(i32, 32), [i // 2 for i in range(32)])
        # byte i of the low (high) bytes: the even value's word's (i even) or the odd value's word's (64 + ...)
        low_bytes = ir.Constant(ir.VectorType(i32, 64), [i if i % 2 == 0 else 63 + i for i in range(64)])
        high_bytes = ir.Constant(ir.VectorType(i32, 64), [i + 1 if i % 2 == 0 else 64 + i for i in range(64)])
        src, dst = data(0), data(4)
        factors = {}
        for j in range(16):  # sub-block j's scales of the 16 rows: in the even bytes, in the odd bytes, 32 sc
            scale = builder.sext(builder.load(pointer(data(2), args[3], 16 * j, b16), align=1), w16)
            words = builder.shuffle_vector(scale, ir.Constant(w16, None), by_pairs)
            even = builder.bitcast(builder.and_(words, splat(w32, 0xFF)), b64)
            odd = builder.bitcast(builder.shl(words, splat(w32, 8)), b64)
            factors[j] = (even, odd, builder.shl(words, splat(w32, 5)))
        for c in range(4):  # vector c: quad 2 c's low nibbles in its low nibbles, 2 c + 1's in its high ones
            for lane in range(8):
                packed = builder.load(pointer(src, args[1], 512 * c + 64 * lane, b64), align=1)
                high_bits = builder.load(pointer(src, args[1], 2048 + 512 * (c // 2) + 64 * lane, b64), align=1)
                for h in range(2):  # quad 2 c + h: its 5th and 6th bits at bits 2 (quad % 4) of vector 4 + quad // 4
                    quad = 2 * c + h
                    low = builder.and_(packed, splat(b64, 15)) if h == 0 else builder.lshr(packed, splat(b64, 4))
                    top = builder.and_(builder.lshr(high_bits, splat(b64, 2 * (quad % 4))), splat(b64, 3))
                    value = builder.or_(low, builder.shl(top, splat(b64, 4)))  # q, 0..63
                    even, odd, offset = factors[2 * quad + lane // 4]
                    w_even = builder.bitcast(builder.sub(maddubs(value, even), offset), b64)
                    w_odd = builder.bitcast(builder.sub(maddubs(value, odd), offset), b64)
                    at = 512 * quad + 64 * lane
                    builder.store(
                        builder.shuffle_vector(w_even, w_odd, low_bytes), pointer(dst, args[5], at, b64), align=1
                    )
                    high = builder.shuffle_vector(w_even, w_odd, high_bytes)
                    builder.store(high, pointer(dst, args[5], UNPACKED + at, b64), align=1)
        return context.get_dummy_value()

    return types.void(quants, types.intp, sub_scales, types.intp, digits, types.intp), codegen


@functools.cache
def kernel(qtype: int, tier_name: str):
    """amx_tiles_k's kernel for a type on a tier (by name), made once per process."""
    return amx_tiles_k(qtype, cpu.get(tier_name))


# every tile 16 rows of 64 bytes but the mins' A tile (tmm6: 16 rows of 32 bytes) and B tile (tmm7: 8 rows)
CONFIG = amx.config_bytes()
CONFIG[16 + 2 * 6] = 2 * TILE_ROWS
CONFIG[48 + 7] = 8


def matmul(kernel, tiles, a, out: np.ndarray) -> np.ndarray:
    """out (T16, N) = tiles (superblock_tiles.py, the values' order) times the first T16 rows of the Q8_K
    activations a (Q8KBlocks, quantize_q8_k)."""
    return kernel(
        tiles.quants, tiles.scales, tiles.mins, tiles.sub_scales, a.q, a.d, a.sum32, out, CONFIG, get_num_threads()
    )


def _array_data(context, builder, signature, args, index):
    """An intrinsic's array argument `index`: its data pointer."""
    return context.make_array(signature.args[index])(context, builder, args[index]).data


def _vector_pointer(builder, base, at, offset, vector_type):
    """base + at + offset (elements of base), as a pointer to vector_type."""
    where = builder.gep(base, [builder.add(at, ir.Constant(ir.IntType(64), offset))])
    return builder.bitcast(where, vector_type.as_pointer())
