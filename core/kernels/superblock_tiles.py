"""Q4_K, Q5_K and Q6_K weights repacked once at load into tiles of 16 rows, for the K-quant tile kernel.

The kernel takes, per row and token, each super-block's exact integer sum (every value times its
sub-block's scale) and one float step for it, as ggml's x86 repack kernel does (superblock_kernels.tiles_k).
How the values are grouped inside a super-block is then free; a tile groups them in "quads" of 4 values,
one 64-byte vector giving a quad for 16 rows, so that vpmaddubsw turns it into int16 pairs (bytes 0, 1
and 2, 3), each pair within one sub-block, and vpmaddwd by the pair's scales into exact int32. The quads
come from ggml's reference dot's 8 lanes (value e in lane e % 8): quad Q < 8 of lane l holds, with Q = 2 c + h,

    value(Q, l, i) = 64 c + 16 h + 32 (i // 2) + 8 (i % 2) + l,    i < 4:

bytes 0, 1 in 32-value sub-block 2 c, bytes 2, 3 in 2 c + 1 (Q6_K's 16-value sub-blocks 4 c + h and
4 c + 2 + h). Quads 2 c and 2 c + 1 share Q4_K's and Q5_K's scale pair (sc[2 c], sc[2 c + 1]), and so do a
unit's quads across lanes, so the kernel adds the int16 products of several lanes before one vpmaddwd
(superblock_dots.LANES_PER_WORD_SUM). The activations come in the same order (activations.py,
quantize_q8_k_quads: value(Q, l, i) at 32 Q + 4 l + i), so a quad of them is one 4-byte broadcast.

On 512-bit VNNI tiers (natural_order) the quads lie in the values' own order instead, quad Q of lane l the values
32 Q + 4 l + i, all four in one sub-block (Q6_K's: lanes 0-3 in 16-value sub-block 2 Q, 4-7 in 2 Q + 1): vpdpbusd
then sums a quad's 4 products, and several lanes', into int32 (superblock_dots.superblock_unit_vnni), which pays where
vpmaddubsw's int16 pairs took a vpaddw each. The activations are then quantize_q8_k's as they are. Everything
below holds for both orders, with quad_value replaced by 32 Q + 4 l + i (_value_at).

A tile holds 16 rows; super-block sb of it is 8 x LANE_BYTES bytes at quants[tile, 8 sb LANE_BYTES:],
vector v of lane l at 64 (8 v + l) in it (so the kernel's 4 lanes of one vector are 256 bytes in a row),
each vector [row r][byte i]:

    v = c < 4     nibbles: low nibbles quad 2 c, high nibbles quad 2 c + 1 (every type)
    v = 4         Q5_K: 5th bits, bit Q of byte i quad Q's
    v = 4 + k     Q6_K, k < 2: high bits, bits 2 q, 2 q + 1 of byte i quad 4 k + q's

and per row r: scales[tile, 16 sb + r] its float16 d, mins[tile, 16 sb + r] its dmin (Q4_K, Q5_K); Q6_K's
mins, outside the values' order, two uint16 a row and super-block holding an int32 (mins[tile].view(int32)[16 sb + r]):
-128 x the sum of sc x (q - 32) over the super-block, where the kernel's centred sums begin
(superblock_dots.superblock_tile_sum: its values q - 32 against the activations + 128, no offset to take off per token);
sub_scales[tile, (SUB * sb + i) * 16 + r] byte i of the row's sub-block scales as the file stores them:
Q4_K's and Q5_K's 12 bytes packing 8 6-bit scales and 8 6-bit mins (SUB = 12; the kernel unpacks a
super-block's for all 16 rows at once, k4_tile_pairs), Q6_K's 16 int8 scales (SUB = 16).
So a tile takes exactly the file's bytes. Q6_K's values go into tiles_k's dots centred, q - 32 (Q6_K's mins
above). Rows past the matrix's end fill the last tile with zeros (their row starts 0 too: zero scales).

One exception to the file's bytes: a mixture's Q6_K expert tensors on the vpmaddubsw tiers (expert_byte_values), whose
tiles hold one byte per value, q - 32, vector v of a lane being quad v (so 8 x 64 bytes a lane and super-block,
quant_blocks.Q6_K_BYTES), everything else as above. Unpacking 6-bit values cost ~7 vector operations a weight vector,
which the dense kernel shares over 16 rows but an expert's pass of a few rows could not: the grouped kernel ran its
Q6_K down experts at half Q4_K's speed. Those tensors take 4/3 of their bytes in the file.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from llvmlite import ir
from numba import njit, prange, types
from numba.core.extending import intrinsic

from miro.core.kernels.quant_blocks import Q4_K, Q5_K, Q6_K, Q6_K_BYTES
from miro.core.kernels.simd import load16, prefetch_l2_lines, store16
from miro.core.kernels.superblock_dots import scale_pairs16
from miro.core.kernels.tiles import TILE_ROWS, Tiles

LANE_BYTES = {Q4_K: 4 * 64, Q5_K: 5 * 64, Q6_K: 6 * 64, Q6_K_BYTES: 8 * 64}  # a tile's quants per super-block and lane
NATURAL_TYPES = (Q4_K, Q5_K, Q6_K)  # the types whose tiles take the values' own order on 512-bit VNNI tiers


# The K-quant tiles in the values' order, read a row or two at a time (a sequence's decode, a batch's tail), stream
# from memory below what the memory gives: Q5_K's and Q6_K's units read their nibble vector and a shared vector of
# high bits 2 KB on, a pattern the hardware prefetchers do not follow, and Q4_K's linear walk alone reached ~30 GB/s
# of the ~36 a C loop with prefetches reads here. Those passes prefetch the super-block PREFETCH_AHEAD on into L2
# (prefetcht1), a quarter before each unit (a burst of all its lines at once was slower; into every level,
# prefetcht0, Q4_K was slower and Q6_K ~25% slower than into L2). Zen 4, 2 threads, weights from memory
# (quant_linear.py --tokens 1,2 --shapes llama3.2-1b --stat min, 3 rounds in turn): one row Q5_K 0.50-0.77x
# llama.cpp without, 0.89-1.85x with; Q4_K 38-91 GFLOP/s (median 60) without, 23-92 (median 74) with; Q6_K's 110 MB
# of the 1B shape's ffn_down 17.0-23.7 GB/s without, 24.0-36.3 with; the 1B shape's one-sequence decode
# (single_sequence.py, 3 rounds in turn) 25.0-27.4 tok/s with Q6_K's alone, 30.1-31.5 with every type's
PREFETCH_AHEAD = 4


@njit(inline="always")
def prefetch_quarter(flat_quants, at, lane_bytes, quarter):
    """Prefetch quarter `quarter` (0-3) of the tile's super-block of 8 lanes at flat_quants[at:], where the tile has one."""
    first = at + quarter * 2 * lane_bytes
    prefetch_l2_lines(flat_quants, first, first + 2 * lane_bytes)


def scale_bytes(qtype: int) -> int:
    """Bytes of sub-block scales (and mins) per super-block and row: Q6_K's 16 int8, Q4_K's and Q5_K's 12 packed."""
    return 16 if qtype == Q6_K else 12


def natural_order(qtype: int, tier) -> bool:
    """Whether a type's tiles on a tier hold their quads in the values' own order, quad Q of lane l the values
    32 Q + 4 l + i (each quad within one sub-block, for vpdpbusd: superblock_dots.superblock_unit_vnni), rather than in
    the lane order of the module's docstring (vpmaddubsw pairs, superblock_dots.superblock_tile_sum). The activations
    come in the same order: quantize_activations.quantize_q8_k then, else quantize_q8_k_quads."""
    return int(qtype) in NATURAL_TYPES and tier.has_vnni and tier.vector_bits == 512


def expert_byte_values(qtype: int, tier) -> bool:
    """Whether a type's expert tiles (the grouped kernel's, core/layers/moe.ExpertTiles) hold one byte per value:
    Q6_K on the vpmaddubsw tiers, where its 6-bit values took ~7 vector operations a weight vector to unpack, shared
    by the few rows an expert takes a pass (Q6_K_BYTES). Its tiles are then 4/3 of the file's bytes."""
    return int(qtype) == Q6_K and not natural_order(qtype, tier)


def repack_superblocks(qtype: int, w: np.ndarray, natural: bool = False, byte_values: bool = False):
    """w (rows, n_super * block bytes) uint8, as the file stores it, to a Tiles (tiles.py); natural: the quads
    in the values' order (natural_order); byte_values (Q6_K, lane order): one byte per value, q - 32 (Q6_K_BYTES)."""
    qtype = int(qtype)
    if byte_values and (qtype != Q6_K or natural):
        raise ValueError("one byte per value is Q6_K's expert layout in the lane order only")
    rows = w.shape[0]
    n_super = w.shape[1] // GGML_QUANT_SIZES[GGMLQuantizationType(qtype)][1]
    n_tiles = -(-rows // TILE_ROWS)
    has_mins = qtype != Q6_K
    n_mins = n_super * TILE_ROWS if has_mins else 0 if natural else 2 * n_super * TILE_ROWS  # Q6_K: its row starts
    tiles = Tiles(
        np.zeros((n_tiles, n_super * 8 * LANE_BYTES[Q6_K_BYTES if byte_values else qtype]), np.uint8),
        np.zeros((n_tiles, n_super * TILE_ROWS), np.uint16),
        np.zeros((n_tiles, n_mins), np.uint16),
        False,
        np.zeros((n_tiles, n_super * scale_bytes(qtype) * TILE_ROWS), np.uint8),
    )
    lane_bytes = LANE_BYTES[Q6_K_BYTES if byte_values else qtype]
    _repack(qtype, w, tiles.quants, tiles.scales, tiles.mins, tiles.sub_scales, lane_bytes, natural, byte_values)
    return tiles


@njit(cache=True, parallel=True)
def _repack(qtype, w, quants, scales, mins, sub_scales, lane_bytes, natural, byte_values):
    rows = w.shape[0]
    n_tiles, n_scales = scales.shape
    n_super = n_scales // TILE_ROWS
    block_bytes = w.shape[1] // n_super
    for tile in prange(n_tiles):
        values = np.empty(256, np.int16)
        for r in range(min(TILE_ROWS, rows - tile * TILE_ROWS)):
            row = w[tile * TILE_ROWS + r]
            for sb in range(n_super):
                off = sb * block_bytes
                at = sb * TILE_ROWS + r
                _raw_values(qtype, row, off, values)
                if qtype == Q6_K:
                    scales[tile, at] = np.uint16(row[off + 208]) | (np.uint16(row[off + 209]) << 8)
                    start = np.int32(0)  # -128 x the sum of sc x (q - 32): value v in 16-value sub-block v // 16
                    for j in range(16):
                        sub_scales[tile, (16 * sb + j) * TILE_ROWS + r] = row[off + 192 + j]
                        centred = np.int32(0)
                        for i in range(16):
                            centred += np.int32(values[16 * j + i]) - 32
                        start -= 128 * np.int32(np.int8(row[off + 192 + j])) * centred
                    if mins.shape[1]:  # outside the values' order: the row start, as two uint16 (little-endian)
                        mins[tile, 2 * at] = np.uint16(start & 0xFFFF)
                        mins[tile, 2 * at + 1] = np.uint16((start >> 16) & 0xFFFF)
                else:
                    scales[tile, at] = np.uint16(row[off]) | (np.uint16(row[off + 1]) << 8)
                    mins[tile, at] = np.uint16(row[off + 2]) | (np.uint16(row[off + 3]) << 8)
                    for i in range(12):
                        sub_scales[tile, (12 * sb + i) * TILE_ROWS + r] = row[off + 4 + i]
                for lane in range(8):  # vector v of lane l at 64 (8 v + l) in the super-block
                    base = 8 * sb * lane_bytes + 64 * lane + 4 * r
                    if byte_values:  # vector v: quad v's q - 32
                        for quad in range(8):
                            for i in range(4):
                                quants[tile, base + 512 * quad + i] = np.uint8(
                                    (values[_value_at(False, quad, lane, i)] - 32) & 0xFF
                                )
                        continue
                    for i in range(4):
                        high_bits = 0
                        for c in range(4):
                            low = values[_value_at(natural, 2 * c, lane, i)]
                            high = values[_value_at(natural, 2 * c + 1, lane, i)]
                            quants[tile, base + 512 * c + i] = (low & 15) | ((high & 15) << 4)
                            high_bits |= ((low >> 4) << (2 * c)) | ((high >> 4) << (2 * c + 1))
                        if qtype == Q5_K:  # bit Q: quad Q's 5th bit
                            quants[tile, base + 512 * 4 + i] = high_bits
                        if qtype == Q6_K:  # bits 2 q, 2 q + 1 of vector 4 + k: quad 4 k + q's 5th and 6th bits
                            for k in range(2):
                                packed = 0
                                for q in range(4):
                                    packed |= (values[_value_at(natural, 4 * k + q, lane, i)] >> 4) << (2 * q)
                                quants[tile, base + 512 * (4 + k) + i] = packed


@njit(cache=True)
def sub_block_sum_pairs(sum32, n_tok, n_pairs):
    """The first n_tok rows' 32-value sub-block sums as int16 pairs, sub-blocks 2 j and 2 j + 1 (|sum| <= 32 x 128)
    in one int32 at [token][j < n_pairs], for vpmaddwd against the pairs of Q4_K's, Q5_K's mins (n_pairs 0: none)."""
    pairs = np.empty((n_tok, n_pairs), np.int32)
    for t in range(n_tok):
        for j in range(n_pairs):
            pairs[t, j] = (sum32[t, 2 * j] & 0xFFFF) | (sum32[t, 2 * j + 1] << 16)
    return pairs


@njit(cache=True)
def q6_k_group_starts(a_rows):
    """-32 x the sum of each 8 values of the activation rows a_rows (int8, flat, in the values' order): where
    superblock_dots.superblock_unit_vnni begins each group's int32 sum of Q6_K's values q, so that it ends as the sum
    of (q - 32) x the activations."""
    starts = np.empty(a_rows.size // 8, np.int32)
    for g in range(starts.size):
        total = np.int32(0)
        for i in range(8):
            total += np.int32(a_rows[8 * g + i])
        starts[g] = np.int32(-32) * total
    return starts


@njit(inline="always")
def begin_sums(isums, tile_starts, sb, n, sets, from_starts):
    """Zero a pass's int32 sums (`sets` sets of n rows x 16) for super-block sb; where from_starts (Q6_K centred),
    each row's first set begins at the row's start the repack stores in the tile's mins."""
    if from_starts:
        starts = load16(tile_starts, TILE_ROWS * sb)
        for t in range(n):
            store16(isums, TILE_ROWS * t, starts)
        isums[n * TILE_ROWS : sets * n * TILE_ROWS] = 0
    else:
        isums[: sets * n * TILE_ROWS] = 0


@njit(inline="always")
def quad_value(quad, lane, i):
    """The value of a super-block at byte i of quad `quad` of ggml lane `lane` (the module's docstring)."""
    return 64 * (quad // 2) + 16 * (quad % 2) + 32 * (i // 2) + 8 * (i % 2) + lane


@njit(inline="always")
def _value_at(natural, quad, lane, i):
    """The value at byte i of quad `quad` of lane `lane`: in the values' order (natural_order) or quad_value's."""
    return 32 * quad + 4 * lane + i if natural else quad_value(quad, lane, i)


@njit(inline="always")
def _raw_values(qtype, row, off, values):
    """A super-block's 256 quants as stored, unsigned (4, 5 or 6 bits), into values (int16)."""
    if qtype == Q6_K:
        for half in range(2):
            for quarter in range(4):
                for j in range(32):
                    low = (np.int32(row[off + 64 * half + 32 * (quarter % 2) + j]) >> (4 * (quarter // 2))) & 15
                    high = (np.int32(row[off + 128 + 32 * half + j]) >> (2 * quarter)) & 3
                    values[128 * half + 32 * quarter + j] = low | (high << 4)
        return
    qs = off + (16 if qtype == Q4_K else 48)
    for s in range(8):
        for j in range(32):
            q = (np.int32(row[qs + 32 * (s // 2) + j]) >> (4 * (s % 2))) & 15
            if qtype == Q5_K:
                q |= ((np.int32(row[off + 16 + j]) >> s) & 1) << 4
            values[32 * s + j] = q


def _quad_order_masks() -> list[list[int]]:
    """For each 64 values 64 c.. of a super-block, the two 32-byte quads 2 c, 2 c + 1 as shuffle masks."""
    masks = []
    for h in range(2):
        masks.append([16 * h + 32 * (i // 2) + 8 * (i % 2) + lane for lane in range(8) for i in range(4)])
    return masks


@intrinsic
def store_in_quad_order(typingctx, source, source_at, dest, dest_at):
    """dest[dest_at + 32 Q + 4 l + i] = source[source_at + quad_value(Q, l, i)] for one super-block of int8: four
    64-byte loads, eight constant shuffles (vpermb where the CPU has it), eight 32-byte stores."""

    def codegen(context, builder, signature, args):
        i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
        v64, v32 = ir.VectorType(i8, 64), ir.VectorType(i8, 32)
        src = context.make_array(signature.args[0])(context, builder, args[0]).data
        dst = context.make_array(signature.args[2])(context, builder, args[2]).data
        masks = [ir.Constant(ir.VectorType(i32, 32), m) for m in _quad_order_masks()]
        for c in range(4):
            at = builder.add(args[1], ir.Constant(i64, 64 * c))
            block = builder.load(builder.bitcast(builder.gep(src, [at]), v64.as_pointer()), align=1)
            for h in range(2):
                quad = builder.shuffle_vector(block, ir.Constant(v64, None), masks[h])
                to = builder.add(args[3], ir.Constant(i64, 32 * (2 * c + h)))
                builder.store(quad, builder.bitcast(builder.gep(dst, [to]), v32.as_pointer()), align=1)
        return context.get_dummy_value()

    return types.void(source, types.intp, dest, types.intp), codegen


@intrinsic
def k4_tile_pairs(typingctx, packed, packed_at, pairs, pairs_at, min_pairs, min_at):
    """One super-block's Q4_K/Q5_K scales and mins for the 16 rows of a tile, unpacked as ggml's get_scale_min_k4
    (quant_blocks.unpack_k4) and paired for vpmaddwd, in vectors of 16 rows: from packed[packed_at + 16 i + r]
    (packed byte i < 12 of row r), pairs[pairs_at + 16 j + r] = row r's 6-bit scales of sub-blocks 2 j (low int16)
    and 2 j + 1 (high), min_pairs[min_at + 16 j + r] the same of its mins (j < 4). (A scalar loop over the rows and
    bytes cost more than the dots of one activation row.)"""

    def codegen(context, builder, signature, args):
        i8, i16, i32, i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
        v16, w16, d16 = ir.VectorType(i8, 16), ir.VectorType(i16, 16), ir.VectorType(i32, 16)
        interleave = ir.Constant(ir.VectorType(i32, 32), [i // 2 + 16 * (i % 2) for i in range(32)])

        def data(index):
            return context.make_array(signature.args[index])(context, builder, args[index]).data

        src, pair_data, min_data = data(0), data(2), data(4)

        def const(value):
            return ir.Constant(v16, [value] * 16)

        def load(i):
            at = builder.add(args[1], ir.Constant(i64, 16 * i))
            return builder.load(builder.bitcast(builder.gep(src, [at]), v16.as_pointer()), align=1)

        def store_pair(base, at, j, low, high):
            words = builder.shuffle_vector(builder.zext(low, w16), builder.zext(high, w16), interleave)
            where = builder.gep(base, [builder.add(at, ir.Constant(i64, 16 * j))])
            builder.store(builder.bitcast(words, d16), builder.bitcast(where, d16.as_pointer()), align=4)

        packed_bytes = [load(i) for i in range(12)]
        scales, mins = [None] * 8, [None] * 8
        for q in range(4):  # quant_blocks.unpack_k4 on bytes q, q + 4, q + 8 of every row at once
            low, high, top = packed_bytes[q], packed_bytes[q + 4], packed_bytes[q + 8]
            scales[q] = builder.and_(low, const(63))
            mins[q] = builder.and_(high, const(63))
            scales[q + 4] = builder.or_(
                builder.and_(top, const(15)), builder.shl(builder.lshr(low, const(6)), const(4))
            )
            mins[q + 4] = builder.or_(builder.lshr(top, const(4)), builder.shl(builder.lshr(high, const(6)), const(4)))
        for j in range(4):
            store_pair(pair_data, args[3], j, scales[2 * j], scales[2 * j + 1])
            store_pair(min_data, args[5], j, mins[2 * j], mins[2 * j + 1])
        return context.get_dummy_value()

    return types.void(packed, types.intp, pairs, types.intp, min_pairs, types.intp), codegen


@njit(inline="always")
def q6_k_scale_pairs(sub_scales, sb, pairs):
    """pairs[16 j + r]: row r's int16 scales of bytes 0, 1 (low) and 2, 3 (high) of Q6_K's quads
    (the module's docstring): its 16-value sub-blocks 4 c + h and 4 c + 2 + h (quad j = 2 c + h), from its int8 scales
    as its tile holds them. (Q4_K's and Q5_K's: k4_tile_pairs.)"""
    for j in range(8):
        low = (16 * sb + 4 * (j // 2) + j % 2) * TILE_ROWS
        store16(pairs, TILE_ROWS * j, scale_pairs16(sub_scales, low, low + 2 * TILE_ROWS, True))
