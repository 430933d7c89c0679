"""Integer dots of K-quant super-block tiles (superblock_tiles.py) for numba, as x86 intrinsics, one form per CPU
tier: int8_dots.py's design (and its VectorOps) for the K-quant tile kernels (superblock_kernels.py, and
grouped_superblocks.py and amx_superblocks.py, which give their bits). Integer sums are exact and none of these
saturates on the values given to it, so every form gives the same sums, the same as the portable kernels'.

- `superblock_tile_sum(...)`: a quarter of a K-quant tile's super-block (superblock_tiles.py) against several
  activation rows, added to exact int32 sums, for the K-quant tile kernel; `mins_dot` the sums of the scales or
  mins against the activations' sub-block sums that its minimums (and Q6_K's offset of 32) take off.
- `superblock_unit_vnni(...)`: the same sums on 512-bit VNNI tiers from tiles whose quads lie in the values' order
  (superblock_tiles.natural_order), by vpdpbusd into int32 and one vpdpwssd per int16-sized group of lanes.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic

from miro.core.kernels.int8_dots import VectorOps, as_vec16
from miro.core.kernels.quant_blocks import Q4_K, Q5_K, Q6_K, Q6_K_BYTES
from miro.core.kernels.simd import LANES, int32x16, splat

_I8, _I16, _I32, _I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_V16 = ir.VectorType(_I32, LANES)
SIXTEEN_VALUE_SCALES = (Q6_K, Q6_K_BYTES)  # a scale per 16 values: a scale pair per quad, a word sum per quad


@intrinsic(prefer_literal=True)
def scale_pairs16(typingctx, array, low_at, high_at, signed):
    """int32x16 whose lane r holds two int16: array[low_at + r] low, array[high_at + r] high (uint8 bytes,
    taken as int8 if `signed`, a compile-time constant): the operand vpmaddwd multiplies a lane's pair by."""
    if not isinstance(signed, types.BooleanLiteral):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        v_bytes, v_words = ir.VectorType(_I8, LANES), ir.VectorType(_I16, LANES)
        extend = builder.sext if signature.args[3].literal_value else builder.zext
        halves = [
            extend(builder.load(builder.bitcast(builder.gep(data, [at]), v_bytes.as_pointer()), align=1), v_words)
            for at in args[1:3]
        ]
        interleave = [i // 2 + LANES * (i % 2) for i in range(2 * LANES)]
        pairs = builder.shuffle_vector(halves[0], halves[1], ir.Constant(ir.VectorType(_I32, 2 * LANES), interleave))
        return builder.bitcast(pairs, _V16)

    return int32x16(array, types.intp, types.intp, signed), codegen


@intrinsic(prefer_literal=True)
def mins_dot(typingctx, min_pairs, m_start, sum_pairs, at, bits, n_pairs):
    """int32x16: lane r = sum over j < n_pairs of the int16 pair min_pairs[m_start + 16 j + r] times the int16 pair
    sum_pairs[at + j], by vpmaddwd (one 512-bit or two 256-bit ones per pair, by `bits`; bits and n_pairs
    compile-time constants). Q4_K, Q5_K (4 pairs): row r's mins of sub-blocks 2 j, 2 j + 1 against the activations'
    sums of those two sub-blocks' 32 values (|sum| <= 32 x 127), low then high. Q6_K (8 pairs): row r's scale pairs
    of quad j against the activations' sums of the two 16-value sub-blocks they scale (superblock_kernels.tiles_k)."""
    if not all(isinstance(ty, types.IntegerLiteral) for ty in (bits, n_pairs)):
        return None
    width = bits.literal_value // 8

    def codegen(context, builder, signature, args):
        pair_data = context.make_array(signature.args[0])(context, builder, args[0]).data
        sum_data = context.make_array(signature.args[2])(context, builder, args[2]).data
        ops = VectorOps(builder, width)
        v_words, v_dwords = ops.words, ops.dwords
        parts = 64 // width
        totals = [ir.Constant(v_dwords, [0] * (width // 4))] * parts
        for j in range(n_pairs.literal_value):
            pair = builder.load(builder.gep(sum_data, [builder.add(args[3], ir.Constant(_I64, j))]))
            activation = builder.bitcast(splat(builder, pair, v_dwords), v_words)
            for p in range(parts):
                at = builder.add(args[1], ir.Constant(_I64, LANES * j + (width // 4) * p))
                mins = builder.load(builder.bitcast(builder.gep(pair_data, [at]), v_dwords.as_pointer()), align=4)
                totals[p] = builder.add(totals[p], ops.madd(builder.bitcast(mins, v_words), activation))
        return as_vec16(builder, totals)

    return int32x16(min_pairs, types.intp, sum_pairs, types.intp, bits, n_pairs), codegen


class SuperblockLane:
    """The IR of one lane of a K-quant tile's super-block: quads 2 c and 2 c + 1 of it (c = `unit`, an IR value:
    a run-time one or a constant), unpacked, and int16 products summed into int32 by scale pairs. quants: the
    lane's bytes from w_start; pairs: the int16 scale pairs of unit c from p_start (Q6_K: quad 2 c's, then
    2 c + 1's 16 further on), as superblock_tile_sum describes."""

    def __init__(
        self, builder, width: int, kind: int, with_vnni: bool, quants, w_start, pairs, p_start, unit, centred=False
    ):
        self.builder, self.width, self.kind, self.with_vnni, self.centred = builder, width, kind, with_vnni, centred
        self.parts = 64 // width
        self.ops = VectorOps(builder, width)
        self.quants, self.w_start, self.pairs, self.unit = quants, w_start, pairs, unit
        self.p_start = builder.add(
            p_start, builder.mul(unit, ir.Constant(_I64, 32 if kind in SIXTEEN_VALUE_SCALES else 16))
        )

    def load(self, base, at, vector_type, align):
        return self.builder.load(
            self.builder.bitcast(self.builder.gep(base, [at]), vector_type.as_pointer()), align=align
        )

    def at(self, start, offset):
        return self.builder.add(start, ir.Constant(_I64, offset))

    def weight_vector(self, v, p):
        """Vector v (an IR value) of the lane, part p: the super-block's vectors lie [v][lane] (superblock_tiles.py)."""
        at = self.builder.add(self.w_start, self.builder.mul(v, ir.Constant(_I64, 8 * 64)))
        return self.load(self.quants, self.at(at, self.width * p), self.ops.bytes, 1)

    def _bits_to_4(self, vector, low_bit, count: int):
        """Bits low_bit.. low_bit + count - 1 (low_bit an IR value) of each byte, moved to bits 4.. : one uniform
        int16 shift (x86 has no byte shifts; the bits that cross from the byte above are masked off)."""
        builder, ops = self.builder, self.ops
        shift = splat(builder, builder.trunc(low_bit, _I16), ops.words)
        moved = builder.bitcast(builder.lshr(builder.bitcast(vector, ops.words), shift), ops.bytes)
        return builder.shl(builder.and_(moved, ops.splat_bytes((1 << count) - 1)), ops.splat_bytes(4))

    def quad(self, h, p):
        """Quad 2 c + h (h = 0, 1) of the part p's rows: unsigned bytes (Q4_K, Q5_K: 0..31; Q6_K: 0..63, its values
        before the offset of 32, or with it, q - 32 signed, where `centred`). All are in nibble vector c: quad 2 c in
        the low nibbles, 2 c + 1 in the high ones."""
        builder, splat_bytes, c = self.builder, self.ops.splat_bytes, self.unit
        if self.kind == Q6_K_BYTES:  # vector 2 c + h is the quad, q - 32 (superblock_tiles.expert_byte_values)
            return self.weight_vector(builder.add(builder.mul(c, ir.Constant(_I64, 2)), ir.Constant(_I64, h)), p)
        packed = self.weight_vector(c, p)
        value = builder.and_(packed, splat_bytes(15)) if h == 0 else builder.lshr(packed, splat_bytes(4))
        quad = builder.add(builder.mul(c, ir.Constant(_I64, 2)), ir.Constant(_I64, h))
        if self.kind == Q6_K:  # bits 2 (q % 4), + 1 of vector 4 + q // 4 move to bits 4, 5
            high = self.weight_vector(builder.add(builder.lshr(quad, ir.Constant(_I64, 2)), ir.Constant(_I64, 4)), p)
            shift = builder.mul(builder.and_(quad, ir.Constant(_I64, 3)), ir.Constant(_I64, 2))
            value = builder.or_(value, self._bits_to_4(high, shift, 2))
            return builder.sub(value, splat_bytes(32)) if self.centred else value
        if self.kind == Q5_K:  # bit q of vector 4 moves to bit 4
            value = builder.or_(value, self._bits_to_4(self.weight_vector(ir.Constant(_I64, 4), p), quad, 1))
        return value

    def accumulate(self, acc, words, scale_pair):
        """acc + each int16 pair of words times scale_pair's, summed into int32 (vpdpwssd, or vpmaddwd + vpaddd)."""
        ops = self.ops
        if self.with_vnni:
            return ops.call(
                f"llvm.x86.avx512.vpdpwssd.{ops.suffix}",
                ops.dwords,
                [acc, self.builder.bitcast(words, ops.dwords), self.builder.bitcast(scale_pair, ops.dwords)],
            )
        return self.builder.add(acc, ops.madd(words, scale_pair))

    def scale_pairs(self, h):
        """Unit c's scale pairs: Q4_K's and Q5_K's for both quads (h = 0), Q6_K's for quad 2 c + h."""
        return [
            self.builder.bitcast(
                self.load(self.pairs, self.at(self.p_start, 16 * h + (self.width // 4) * p), self.ops.dwords, 4),
                self.ops.words,
            )
            for p in range(self.parts)
        ]

    def zeros(self):
        return [ir.Constant(self.ops.dwords, [0] * (self.width // 4)) for _ in range(self.parts)]


# lanes whose int16 products (two quads' for Q4_K and Q5_K, one quad's for Q6_K) add up without overflow before
# one vpmaddwd by their shared scale pair: per lane at most 2 x 2 x 15 x 127 = 7,620 (Q4_K), 2 x 2 x 31 x 127 =
# 15,748 (Q5_K), 2 x 63 x 127 = 16,002 (Q6_K, its unsigned values); an int16 holds 32,767
LANES_PER_WORD_SUM = {Q4_K: 4, Q5_K: 2, Q6_K: 2, Q6_K_BYTES: 2}


def lanes_per_call(qtype: int, bits: int, tokens: int) -> int:
    """superblock_tile_sum's lanes per call, their quads of one unit kept in registers across the activation rows:
    as many as 32 zmm or 16 ymm hold beside the rest (measured on one Zen 4 core). One activation row reuses no
    weight register: all 8 lanes in one call, the int32 sums loaded and stored once per unit, not 2 or 4 times."""
    if tokens == 1:
        return 8
    return 4 if bits == 512 and qtype not in SIXTEEN_VALUE_SCALES else 2


def split_sums(bits: int, tokens: int) -> bool:
    """Whether superblock_tile_sum's calls for `tokens` activation rows add to two sets of sums in turn (its
    docstring's S): on 256-bit tiers from 4 rows, where a call takes 2 of the lanes and its rows' sums fill more
    registers than there are (at 2 rows they fit: one set, kept in registers from call to call, ran faster)."""
    return bits == 256 and tokens >= 4


@intrinsic(prefer_literal=True)
def superblock_tile_sum(
    typingctx, quants, w_start, pairs, p_start, a, a_start, a_stride, isums, unit, first_lane, bits, vnni, qtype, tokens
):
    """Quads 2 c and 2 c + 1 (c = `unit`, run time) of lanes_per_call() lanes from `first_lane` (run time) of one
    super-block of a 16-row K-quant tile (superblock_tiles.py) against `tokens` activation rows, added to exact
    int32 sums:

        isums[S + 16 t + r] += sum over those lanes l, quads Q in (2 c, 2 c + 1) and bytes i of
                               sc(r, Q, i) . (quad Q of lane l of weight row r)[i] . (a[t]'s)[i]

    Called for every c and lane, this gives a row's whole super-block sum, sub-block scales applied: the integer
    the kernel's one float step per super-block takes (ggml's x86 repack order, superblock_kernels.tiles_k). S is 0,
    except on 256-bit tiers from 4 rows (split_sums): there 16 tokens x the parity of first_lane / lanes_per_call(),
    so that calls in turn add to two sets of sums, which the kernel adds up. (With one set, LLVM carried each call's
    sums in registers to the next call of the kernel's loop over the lanes, more than 16 ymm hold: each token's sums
    went through the stack, two loads and two stores more a token and call.) Each lane's
    quads are multiplied by vpmaddubsw into int16 pairs, LANES_PER_WORD_SUM lanes of them added in int16 (they
    share the scale pair), then one vpmaddwd (vpdpwssd where the tier has VNNI) by the pair.

    quants (uint8, 1-D): the tile's super-block at w_start, its vector v of lane l 64 (8 v + l) further. pairs
    (int32, 1-D): at p_start + 16 j + r, row r's int16 scale pair for bytes 0, 1 and 2, 3 of quads 2 j and 2 j + 1
    (Q4_K, Q5_K; j < 4) or of quad j (Q6_K). a (int8, 1-D): row t's super-block in quad order at
    a_start + t * a_stride, quad Q of lane l at 32 Q + 4 l.

    vpmaddubsw multiplies unsigned by signed bytes: the weights' values, unsigned (Q6_K's before its offset of 32,
    which the kernel takes off per token: superblock_kernels.tiles_k), by the signed activations. Nothing saturates.
    Q6_K with `a` uint8 (the activations + 128, "centred"): its values enter as q - 32 (-32..31), the signed operand,
    against the activations + 128 (0..255), the unsigned one: each product is then (q - 32) x a + 128 (q - 32),
    whose second part depends on the weights only (tiles_k begins each row's sum at minus its sum, which the tiles
    hold: superblock_tiles.py), so no offset of the activations' sums is left to take off per token; a pair of products is at
    most 2 x 32 x 255 = 16,320 in magnitude, two lanes' 32,640: an int16 holds them. qtype Q6_K_BYTES
    (superblock_tiles.expert_byte_values): Q6_K whose lane vector v is quad v itself, q - 32, so nothing is unpacked;
    always centred.
    bits, vnni, qtype, tokens: compile-time constants as for int8_dots.tile_dot."""
    if not all(isinstance(ty, types.IntegerLiteral) for ty in (bits, vnni, qtype, tokens)):
        return None
    width = bits.literal_value // 8
    kind = qtype.literal_value
    n_tokens = tokens.literal_value
    sig = types.void(
        quants,
        types.intp,
        pairs,
        types.intp,
        a,
        types.intp,
        types.intp,
        isums,
        types.intp,
        types.intp,
        bits,
        vnni,
        qtype,
        tokens,
    )

    def codegen(context, builder, signature, args):
        w_start_v, p_start_v, a_start_v, stride_v, unit_v, first_lane_v = (args[i] for i in (1, 3, 5, 6, 8, 9))
        per_call = lanes_per_call(kind, bits.literal_value, n_tokens)
        centred = (
            kind in SIXTEEN_VALUE_SCALES and signature.args[4].dtype == types.uint8
        )  # the docstring's centred Q6_K
        if kind == Q6_K_BYTES and not centred:
            raise TypeError("Q6_K's byte values (q - 32, signed) take the activations + 128 (uint8)")
        per_sum = min(LANES_PER_WORD_SUM[kind], per_call)
        w_start_v = builder.add(w_start_v, builder.mul(first_lane_v, ir.Constant(_I64, 64)))
        a_start_v = builder.add(a_start_v, builder.mul(first_lane_v, ir.Constant(_I64, 4)))

        def data(index):
            return context.make_array(signature.args[index])(context, builder, args[index]).data

        lanes = [
            SuperblockLane(
                builder,
                width,
                kind,
                bool(vnni.literal_value),
                data(0),
                builder.add(w_start_v, ir.Constant(_I64, 64 * lane)),
                data(2),
                p_start_v,
                unit_v,
                centred,
            )
            for lane in range(per_call)
        ]
        parts, load, at, ops = lanes[0].parts, lanes[0].load, lanes[0].at, lanes[0].ops
        a_data, isum_data = data(4), data(7)
        a_unit = builder.add(a_start_v, builder.mul(unit_v, ir.Constant(_I64, 64)))  # quad 2 c at 32 (2 c)

        def activation_quad(t, h, lane):
            row_start = builder.add(a_unit, builder.mul(stride_v, ir.Constant(_I64, t)))
            word = builder.load(
                builder.bitcast(builder.gep(a_data, [at(row_start, 32 * h + 4 * lane)]), _I32.as_pointer()), align=1
            )
            return builder.bitcast(splat(builder, word, ops.dwords), ops.bytes)

        if split_sums(bits.literal_value, n_tokens):  # S: the set of sums of this call's lanes (the docstring)
            parity = builder.and_(builder.sdiv(first_lane_v, ir.Constant(_I64, per_call)), ir.Constant(_I64, 1))
            sums_at = builder.mul(parity, ir.Constant(_I64, 16 * n_tokens))
        else:
            sums_at = ir.Constant(_I64, 0)
        pair = [lanes[0].scale_pairs(h) for h in range(2 if kind in SIXTEEN_VALUE_SCALES else 1)]
        zero_words = ir.Constant(ops.words, [0] * (width // 2))
        weights = {}

        def weight(lane, h):
            if (lane, h) not in weights:
                weights[lane, h] = [lanes[lane].quad(h, p) for p in range(parts)]
            return weights[lane, h]

        # the lanes' weights stay in registers across the activation rows; for one row on 256-bit tiers each lane's
        # are unpacked where its dots take them (all 8 lanes' unpacked first, LLVM spilled most of them)
        if not (width == 32 and n_tokens == 1):
            for lane in range(per_call):
                for h in range(2):
                    weight(lane, h)
        for t in range(n_tokens):
            a_quads = {(lane, h): activation_quad(t, h, lane) for lane in range(per_call) for h in range(2)}
            where = [at(sums_at, 16 * t + (width // 4) * p) for p in range(parts)]
            acc = [load(isum_data, where[p], ops.dwords, 4) for p in range(parts)]
            for lane0 in range(0, per_call, per_sum):
                words = [[zero_words] * parts for _ in range(2)]  # Q6_K: a sum per quad; else one for both
                for lane in range(lane0, lane0 + per_sum):
                    for h in range(2):
                        into = h if kind in SIXTEEN_VALUE_SCALES else 0
                        for p in range(parts):
                            w, a_bytes = weight(lane, h)[p], a_quads[lane, h]
                            product = ops.maddubs(a_bytes, w) if centred else ops.maddubs(w, a_bytes)
                            words[into][p] = builder.add(words[into][p], product)
                for h in range(len(pair)):
                    for p in range(parts):
                        acc[p] = lanes[0].accumulate(acc[p], words[h][p], pair[h][p])
            for p in range(parts):
                builder.store(
                    acc[p], builder.bitcast(builder.gep(isum_data, [where[p]]), ops.dwords.as_pointer()), align=4
                )
        return context.get_dummy_value()

    return sig, codegen


# lanes whose vpdpbusd sums (one quad's 4 values a lane) an int32 takes before it must still fit an int16 for
# vpdpwssd by the sub-block's scale: at most 4 x 4 x 15 x 127 = 30,480 (Q4_K's unsigned values), 2 x 4 x 31 x 127
# = 31,496 (Q5_K's), 2 x 4 x 32 x 127 = 32,512 (Q6_K's signed q - 32, with the activations + 128 as vpdpbusd's
# unsigned operand and the int32 started at -128 x the lanes' sum of q - 32)
VNNI_GROUP_LANES = {Q4_K: 4, Q5_K: 2, Q6_K: 2}


@intrinsic(prefer_literal=True)
def superblock_unit_vnni(
    typingctx, quants, w_start, scales, s_start, a, a_start, a_stride, isums, unit, starts, st_start, qtype, tokens
):
    """Quads 2 c and 2 c + 1 (c = `unit`, run time) of one super-block of a 16-row K-quant tile whose quads lie in
    the values' order (superblock_tiles.natural_order: quad Q of lane l the values 32 Q + 4 l + i) against
    `tokens` activation rows, on 512-bit VNNI tiers, added to exact int32 sums:

        isums[16 t + r] += sum over the values v of those quads of sc(r, v) . (row r's v) . (a[t]'s v)

    with Q6_K's values q - 32: the same integers as superblock_tile_sum's (less Q6_K's offset, which this one
    leaves nothing of). Each lane's quad is multiplied by vpdpbusd into int32 (the activation quad a 4-byte
    broadcast), VNNI_GROUP_LANES lanes of one sub-block summed there, a sum that still fits an int16 (the high half
    its sign); then one vpdpwssd by the pair (sc, 0) adds sc times it. Q4_K per sub-block and token: 8 vpdpbusd and
    2 vpdpwssd, where vpmaddubsw took 8 and added its int16 pairs by 7 vpaddw more. The unit's 16 unpacked weight
    vectors stay in registers across the activation rows.

    Q4_K, Q5_K: the weights unsigned, vpdpbusd's unsigned operand, against the signed activations; scales (int32,
    1-D) their pairs, sc(2 j) low int16, sc(2 j + 1) high, at s_start + 16 j + r; a (int8) in the values' order
    (quantize_activations.quantize_q8_k). Q6_K: the weights q - 32 the signed operand, against a (uint8) the
    activations + 128, each group's int32 started at -128 x its sum of q - 32 (once per call), so that it ends as
    the sum of (q - 32) x the activations; scales (uint8, 1-D) the tile's int8 scales, sub-block j's of row r at
    s_start + 16 j + r. Q6_K with a int8 (the activations as they are): the weights q unsigned, each group's int32
    started per token at starts[st_start + (a_stride / 8) t + 8 c + 4 h + g] (int32, 1-D), -32 x the sum of the
    group's 8 activations, so that it ends as the same sum of (q - 32) x the activations: no per-call starts, the
    cheaper way at a row or two, where nothing shares their cost; both quads at once and each token's 8 vpdpwssd in
    4 chains rather than one (a row's sums wait on little else). starts: unused otherwise. quants, a_start,
    a_stride as superblock_tile_sum's. qtype, tokens: compile-time constants."""
    if not all(isinstance(ty, types.IntegerLiteral) for ty in (qtype, tokens)):
        return None
    kind = qtype.literal_value
    n_tokens = tokens.literal_value
    group = VNNI_GROUP_LANES.get(kind, 1)
    row_starts = kind == Q6_K and a.dtype == types.int8  # the groups' starts from the activations, per token
    sig = types.void(
        quants,
        types.intp,
        scales,
        types.intp,
        a,
        types.intp,
        types.intp,
        isums,
        types.intp,
        starts,
        types.intp,
        qtype,
        tokens,
    )

    def codegen(context, builder, signature, args):
        w_start_v, s_start_v, a_start_v, stride_v, unit_v, st_start_v = (args[i] for i in (1, 3, 5, 6, 8, 10))

        def data(index):
            return context.make_array(signature.args[index])(context, builder, args[index]).data

        scale_data = data(2)
        lanes = [
            SuperblockLane(
                builder,
                64,
                kind,
                True,
                data(0),
                builder.add(w_start_v, ir.Constant(_I64, 64 * lane)),
                scale_data,
                s_start_v,
                unit_v,
            )
            for lane in range(8)
        ]
        at, ops = lanes[0].at, lanes[0].ops
        a_data, isum_data = data(4), data(7)
        a_unit = builder.add(a_start_v, builder.mul(unit_v, ir.Constant(_I64, 64)))  # quad 2 c at 32 (2 c)
        dwords = ops.dwords
        zero = ir.Constant(dwords, [0] * LANES)

        def activation_quad(t, h, lane):
            row_start = builder.add(a_unit, builder.mul(stride_v, ir.Constant(_I64, t)))
            word = builder.load(
                builder.bitcast(builder.gep(a_data, [at(row_start, 32 * h + 4 * lane)]), _I32.as_pointer()), align=1
            )
            return splat(builder, word, dwords)

        def call(name, operands):
            return ops.call(f"llvm.x86.avx512.{name}.512", dwords, operands)

        if kind == Q6_K:
            v_bytes, v_words = ir.VectorType(_I8, LANES), ir.VectorType(_I16, LANES)
            scale_base = builder.add(s_start_v, builder.mul(unit_v, ir.Constant(_I64, 4 * LANES)))
            bias = builder.bitcast(ops.splat_bytes(128), dwords)
        else:
            pair = builder.bitcast(lanes[0].scale_pairs(0)[0], dwords)
            low_high = (  # (sc(2 c), 0) and (sc(2 c + 1), 0): the scales are 6-bit, unsigned
                builder.and_(pair, ir.Constant(dwords, [0xFFFF] * LANES)),
                builder.lshr(pair, ir.Constant(dwords, [16] * LANES)),
            )
        if row_starts:  # the weights q unsigned; per token, each group's int32 started at -32 x its activations' sum
            starts_data = data(9)
            weights, scale = {}, {}
            for h in range(2):
                for lane in range(8):
                    weights[lane, h] = builder.bitcast(lanes[lane].quad(h, 0), dwords)
                for g in range(2):  # sub-block 4 c + 2 h + g (lanes 4 g..): its int8 scales, as (sc, 0) pairs
                    where = builder.gep(scale_data, [at(scale_base, (2 * h + g) * LANES)])
                    sc = builder.load(builder.bitcast(where, v_bytes.as_pointer()), align=1)
                    scale[h, g] = builder.zext(builder.sext(sc, v_words), dwords)
            group_base = builder.add(st_start_v, builder.mul(unit_v, ir.Constant(_I64, 8)))
            group_stride = builder.sdiv(stride_v, ir.Constant(_I64, 8))
            for t in range(n_tokens):
                row_groups = builder.add(group_base, builder.mul(group_stride, ir.Constant(_I64, t)))
                products = []
                for h in range(2):
                    for lane0 in range(0, 8, 2):
                        word = builder.load(builder.gep(starts_data, [at(row_groups, 4 * h + lane0 // 2)]), align=4)
                        sums = splat(builder, word, dwords)
                        for lane in (lane0, lane0 + 1):
                            sums = call("vpdpbusd", [sums, weights[lane, h], activation_quad(t, h, lane)])
                        products.append((sums, scale[h, lane0 // 4]))
                where = builder.bitcast(builder.gep(isum_data, [ir.Constant(_I64, 16 * t)]), dwords.as_pointer())
                chains = [builder.load(where, align=4), zero, zero, zero]
                for i, (sums, pair) in enumerate(products):
                    chains[i % 4] = call("vpdpwssd", [chains[i % 4], sums, pair])
                builder.store(
                    builder.add(builder.add(chains[0], chains[1]), builder.add(chains[2], chains[3])), where, align=4
                )
            return context.get_dummy_value()
        # Q6_K one quad at a time over the rows (its 8 weight vectors, scales and starts in registers; both quads'
        # spilled), the others both (their 16 weight vectors in registers)
        weights, scale, start = {}, {}, {}
        for quads in ((0,), (1,)) if kind == Q6_K else ((0, 1),):
            for h in quads:
                unpacked = [lanes[lane].quad(h, 0) for lane in range(8)]
                if kind == Q6_K:
                    unpacked = [builder.sub(w, ops.splat_bytes(32)) for w in unpacked]  # q - 32
                    for g in range(2):  # sub-block 4 c + 2 h + g (lanes 4 g..): its int8 scales, as (sc, 0) pairs
                        where = builder.gep(scale_data, [at(scale_base, (2 * h + g) * LANES)])
                        sc = builder.load(builder.bitcast(where, v_bytes.as_pointer()), align=1)
                        scale[h, g] = builder.zext(builder.sext(sc, v_words), dwords)
                else:
                    scale[h, 0] = scale[h, 1] = low_high[h]
                for lane in range(8):
                    weights[lane, h] = builder.bitcast(unpacked[lane], dwords)
                for lane0 in range(0, 8, group):  # the group's int32 start: Q6_K's -128 x its sum of q - 32, else 0
                    total = zero
                    if kind == Q6_K:
                        for lane in range(lane0, lane0 + group):
                            total = builder.sub(total, call("vpdpbusd", [zero, bias, weights[lane, h]]))
                    start[h, lane0] = total
            for t in range(n_tokens):
                where = builder.bitcast(builder.gep(isum_data, [ir.Constant(_I64, 16 * t)]), dwords.as_pointer())
                acc = builder.load(where, align=4)
                for h in quads:
                    for lane0 in range(0, 8, group):
                        sums = start[h, lane0]
                        for lane in range(lane0, lane0 + group):
                            quad = activation_quad(t, h, lane)
                            if kind == Q6_K:  # the activations unsigned, the weights signed
                                sums = call("vpdpbusd", [sums, quad, weights[lane, h]])
                            else:
                                sums = call("vpdpbusd", [sums, weights[lane, h], quad])
                        acc = call("vpdpwssd", [acc, sums, scale[h, lane0 // 4]])
                builder.store(acc, where, align=4)
        return context.get_dummy_value()

    return sig, codegen
