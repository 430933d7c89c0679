"""Q6_K's super-block sums for one activation row on the vpmaddubsw tiers (AVX2, AVX-512 without VNNI, AVX-VNNI),
from the quad-order tiles of superblock_tiles.py: superblock_kernels.tiles_k's passes of one row.

The other passes take Q6_K's values centred, q - 32 against the activations + 128 (superblock_dots.superblock_tile_sum):
every quad then pays a vpaddb for its - 32, 128 a super-block on 256-bit tiers, which the rows of a pass share
only when there are several. Here the values stay unsigned (0..63), vpmaddubsw's unsigned operand, against the
signed activations, and the offset comes off once per super-block from the activations' 16-value sums:

    sum over v of sc(v) (q(v) - 32) a(v) = sum of sc q a - 32 x sum over sub-blocks j of sc(j) S16(j),

the second sum by one vpmaddwd per quad of the scale pairs the first already loads, against the pair of sums
those scales cover (q6_k_sum_pairs). The same integers as the centred sums, so the same bits.

Each quad is unpacked as (nibbles) | (high bits shifted to bits 4, 5 & 0x30): word shifts whose bits that cross
from the byte above the mask drops. Per 16 weight rows, quad and 256-bit half: 1-2 instructions for the nibbles,
1-2 for the high bits, a vpor, the vpmaddubsw; every two lanes' int16 products (at most 2 x 2 x 63 x 127 =
32,004) a vpmaddwd (vpdpwssd with VNNI) by the quad's scale pair.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core.extending import intrinsic

from miro.core.kernels.superblock_dots import SuperblockLane
from miro.core.kernels.quant_blocks import Q6_K
from miro.core.kernels.simd import splat

_I32, _I64 = ir.IntType(32), ir.IntType(64)


@njit(inline="always")
def q6_k_quad_sums(a_flat, at, n_super, out):
    """out[j]: a row's sums of bytes 0, 1 (low int16) and 2, 3 (high) of its quads j (Q6_K's 16-value sub-blocks in
    the tiles' quad order, superblock_tiles.py), the row's values from a_flat[at], for mins_dot against the scales."""
    for j in range(n_super * 8):
        low = np.int32(0)
        high = np.int32(0)
        for lane in range(8):
            low += np.int32(a_flat[at + 32 * j + 4 * lane]) + np.int32(a_flat[at + 32 * j + 4 * lane + 1])
            high += np.int32(a_flat[at + 32 * j + 4 * lane + 2]) + np.int32(a_flat[at + 32 * j + 4 * lane + 3])
        out[j] = (low & 0xFFFF) | (high << 16)


@njit(cache=True)
def q6_k_sum_pairs(a, row, k):
    """Row `row` of quad-order activations a (T, K) int8 (quantize_activations.quantize_q8_k_quads) as int16 pairs
    of 16-value sums, one int32 per super-block sb and quad Q = 2 c + h at 8 sb + Q: the sums of sub-blocks
    4 c + h (low) and 4 c + 2 + h (high), those that quad's bytes 0, 1 and 2, 3 lie in (|sum| <= 16 x 128)."""
    pairs = np.empty(k // 32, np.int32)
    q6_k_quad_sums(a[row], 0, k // 256, pairs)
    return pairs


@intrinsic(prefer_literal=True)
def q6_k_row_sum(typingctx, quants, w_start, pairs, p_start, a, a_start, sums, s_start, isums, bits, vnni, half):
    """Half `half` (0, 1) of one super-block of a 16-row Q6_K tile, quads 4 half.. 4 half + 3 (nibble vectors
    2 half, 2 half + 1 and high bits vector 4 + half), against one activation row, added to exact int32 sums:

        isums[r] += sum over the half's values v of sc(r, v) . (q(r, v) - 32) . a(v)

    so the two halves add the super-block's sum (two calls, so that a prefetch can go between them).

    quants (uint8, 1-D): the super-block at w_start (superblock_tiles.py's quad order); pairs (int32, 1-D): row r's
    int16 scale pair of quad j at p_start + 16 j + r (superblock_tiles.q6_k_scale_pairs); a (int8, 1-D): the row's
    super-block in quad order at a_start; sums (int32, 1-D): q6_k_sum_pairs's pair of quad j at s_start + j.
    bits (256 or 512), vnni, half: compile-time constants."""
    if not all(isinstance(ty, types.IntegerLiteral) for ty in (bits, vnni, half)):
        return None
    width = bits.literal_value // 8
    with_vnni = bool(vnni.literal_value)
    sig = types.void(quants, types.intp, pairs, types.intp, a, types.intp, sums, types.intp, isums, bits, vnni, half)
    pair = half.literal_value

    def codegen(context, builder, signature, args):
        w_start_v, p_start_v, a_start_v, s_start_v = args[1], args[3], args[5], args[7]

        def data(index):
            return context.make_array(signature.args[index])(context, builder, args[index]).data

        quant_data, pair_data, a_data, sum_data, isum_data = data(0), data(2), data(4), data(6), data(8)
        one = SuperblockLane(
            builder, width, Q6_K, with_vnni, quant_data, w_start_v, pair_data, p_start_v, ir.Constant(_I64, 0)
        )
        ops, parts = one.ops, one.parts

        def word_shift(vector, count):
            """Each 16-bit word of a byte vector shifted left (count > 0) or right by |count| bits."""
            if count == 0:
                return vector
            words = builder.bitcast(vector, ops.words)
            amount = ir.Constant(ops.words, [abs(count)] * (width // 2))
            moved = builder.shl(words, amount) if count > 0 else builder.lshr(words, amount)
            return builder.bitcast(moved, ops.bytes)

        def weights(pair, lane, p):
            """Quads 4 k.. 4 k + 3 (k = pair) of a lane's part p: nibble vectors 2 k, 2 k + 1, high bits vector 4 + k."""
            base = builder.add(w_start_v, ir.Constant(_I64, 64 * lane + width * p))
            high = one.load(quant_data, builder.add(base, ir.Constant(_I64, 8 * 64 * (4 + pair))), ops.bytes, 1)
            quads = []
            for c in (2 * pair, 2 * pair + 1):
                nibbles = one.load(quant_data, builder.add(base, ir.Constant(_I64, 8 * 64 * c)), ops.bytes, 1)
                for h in range(2):
                    low = builder.and_(word_shift(nibbles, -4 * h), ops.splat_bytes(15))
                    q = 2 * (c % 2) + h  # bits 2 q, 2 q + 1 of the high vector to bits 4, 5
                    top = builder.and_(word_shift(high, 4 - 2 * q), ops.splat_bytes(0x30))
                    quads.append(builder.or_(low, top))
            return quads

        def activation_quad(quad, lane):
            at = builder.add(a_start_v, ir.Constant(_I64, 32 * quad + 4 * lane))
            word = builder.load(builder.bitcast(builder.gep(a_data, [at]), _I32.as_pointer()), align=1)
            return builder.bitcast(splat(builder, word, ops.dwords), ops.bytes)

        def scale_pair(quad, p):
            where = builder.add(p_start_v, ir.Constant(_I64, 16 * quad + (width // 4) * p))
            return builder.bitcast(one.load(pair_data, where, ops.dwords, 4), ops.words)

        zero_words = ir.Constant(ops.words, [0] * (width // 2))
        five = ir.Constant(ops.dwords, [5] * (width // 4))
        # the half's 4 quads (their high bits in one vector) one part's rows at a time, 2 lanes between vpmaddwd: in
        # registers (all parts at once LLVM hoisted the high bits vectors and spilled them)
        acc = [ir.Constant(ops.dwords, [0] * (width // 4)) for _ in range(parts)]
        offset = list(acc)
        for quad in range(4 * pair, 4 * pair + 4):
            s16 = builder.load(builder.gep(sum_data, [builder.add(s_start_v, ir.Constant(_I64, quad))]))
            s16 = builder.bitcast(splat(builder, s16, ops.dwords), ops.words)
            for p in range(parts):
                offset[p] = one.accumulate(offset[p], scale_pair(quad, p), s16)
        for p in range(parts):
            for lane0 in range(0, 8, 2):
                words = [zero_words] * 4
                for lane in (lane0, lane0 + 1):
                    for j, w in enumerate(weights(pair, lane, p)):
                        product = ops.maddubs(w, activation_quad(4 * pair + j, lane))
                        words[j] = builder.add(words[j], product)
                for j in range(4):
                    acc[p] = one.accumulate(acc[p], words[j], scale_pair(4 * pair + j, p))
        for p in range(parts):
            where = builder.bitcast(
                builder.gep(isum_data, [ir.Constant(_I64, (width // 4) * p)]), ops.dwords.as_pointer()
            )
            total = builder.sub(acc[p], builder.shl(offset[p], five))
            builder.store(builder.add(builder.load(where, align=4), total), where, align=4)
        return context.get_dummy_value()

    return sig, codegen
