"""Integer dot products of int8 blocks for numba, as x86 intrinsics, one form per CPU tier (cpu.py).

LLVM does not derive vpdpbusd (AVX512-VNNI, AVX-VNNI: 4 u8 x s8 products summed into each int32 lane)
from plain loops, nor vpmaddubsw + vpmaddwd (AVX2, AVX-512BW: ggml's mul_sum_i8_pairs), and without
them the int16 kernels reach about half of llama.cpp's speed, so they come through intrinsics. Integer
sums are exact and none of these saturates on the values given to it, so every form gives the same
sums, the same as the portable kernels'.

- `tile_dot(..., bits, vnni, qtype, tokens)`: a 16-row tile's block (tiles.py) against several activation
  rows, for the tile kernel (tile_kernels.py), on every tier with int8 dots.
- `superblock_tile_dot(...)`: one of ggml's 8 lanes of a K-quant tile's super-block (superblock_tiles.py)
  against several activation rows, with ggml's float step, for the K-quant tile kernel; `superblock_bias`
  what Q6_K's biased activations add to it.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from .quant_blocks import HAS_FIFTH_BITS, Q5_K, Q6_K, Q8_0
from .simd import LANES, int32x16, splat

_I64 = ir.IntType(64)
_V16 = ir.VectorType(ir.IntType(32), LANES)


# ---------------------------------------------------------------- the tile kernel's dots, every int8 tier

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)


class _VectorOps:
    """The vector types and integer instructions of one register width (`width` bytes: 64 for AVX-512BW, 32 for
    AVX2) that the codegens below emit."""

    def __init__(self, builder, width: int):
        self.builder, self.width = builder, width
        self.bytes = ir.VectorType(_I8, width)
        self.words = ir.VectorType(_I16, width // 2)
        self.dwords = ir.VectorType(_I32, width // 4)
        self.suffix = "512" if width == 64 else "256"

    def call(self, name: str, result, operands):
        function = cgutils.get_or_insert_function(
            self.builder.module, ir.FunctionType(result, [op.type for op in operands]), name)
        return self.builder.call(function, operands)

    def maddubs(self, u, s):
        """vpmaddubsw: unsigned bytes u times signed bytes s, adjacent products summed into int16."""
        name = "llvm.x86.avx512.pmaddubs.w.512" if self.width == 64 else "llvm.x86.avx2.pmadd.ub.sw"
        return self.call(name, self.words, [u, s])

    def madd(self, words, other):
        """vpmaddwd: int16 pairs times int16 pairs, each pair's two products summed into int32."""
        name = "llvm.x86.avx512.pmaddw.d.512" if self.width == 64 else "llvm.x86.avx2.pmadd.wd"
        return self.call(name, self.dwords, [words, other])

    def splat_bytes(self, value: int):
        return ir.Constant(self.bytes, [value] * self.width)


def _as_vec16(builder, parts):
    """One int32x16 from a register width's parts: itself on 512-bit tiers, two 8-lane halves joined on 256-bit ones."""
    if len(parts) == 1:
        return parts[0]
    return builder.shuffle_vector(parts[0], parts[1], ir.Constant(_V16, list(range(LANES))))


def tile_signed_bytes(qtype: int, vnni: bool) -> bool:
    """Whether a Q8_0 tile keeps the file's signed bytes (vpmaddubsw tiers: |w| and the sign move to a, as ggml
    does) rather than w + 128 (vpdpbusd tiers, whose unsigned operand is then the weights as they are)."""
    return qtype == Q8_0 and not vnni


@intrinsic(prefer_literal=True)
def tile_dot(typingctx, quants, w_start, a, a_start, a_stride, bits, vnni, qtype, tokens):
    """One 32-value block of a 16-row tile (tiles.py) against `tokens` activation rows, as `tokens` int32x16
    (one per activation row, lane r = weight row r): sum over quads q < 8 and bytes i < 4 of
    w[r, q].byte[i] * a[t, 4 q + i], the tile's unsigned bytes as they are (the caller adds the offset of a
    biased layout).

    quants (uint8, 1-D): the block at w_start, [k][row][4 bytes] (Q4_0/Q4_1: 4 x 64 bytes of nibbles, low
    nibbles quad k, high quad k + 4; Q5_0/Q5_1: the same and 64 bytes of 5th bits, bit q of byte i quad q's;
    Q8_0: 8 x 64 bytes). a (int8, 1-D): activation row t's block at a_start + t * a_stride. Each activation
    quad is broadcast to every row; the weight vectors are loaded once for all the rows.

    bits, vnni, qtype, tokens: compile-time constants. bits 512: one vector per 16 rows; 256: two halves of
    8 rows. vnni: vpdpbusd; else vpmaddubsw into int16 pairs (Q4: 8 quads summed in int16, at most
    8 x 2 x 15 x 127 = 30,480; Q5: 4 quads, at most 4 x 2 x 31 x 127 = 31,496; Q8_0: |w| against a with w's
    sign, at most 2 x 128 x 127 = 32,512 a quad) then vpmaddwd by ones into int32.
    """
    if not all(isinstance(ty, types.IntegerLiteral) for ty in (bits, vnni, qtype, tokens)):
        return None  # numba then retries with the constants as literals
    width = bits.literal_value // 8  # bytes per vector
    with_vnni = bool(vnni.literal_value)
    nibbles = qtype.literal_value != Q8_0
    fifth_bits = qtype.literal_value in HAS_FIFTH_BITS
    quads_per_word_sum = 4 if fifth_bits else 8  # quads whose vpmaddubsw pairs an int16 sum holds
    signed = tile_signed_bytes(qtype.literal_value, with_vnni)
    n_tokens = tokens.literal_value
    sig = types.UniTuple(int32x16, n_tokens)(quants, types.intp, a, types.intp, types.intp, bits, vnni, qtype, tokens)

    def codegen(context, builder, signature, args):
        quants_v, w_start_v, a_v, a_start_v, stride_v = args[:5]
        parts = 64 // width
        ops = _VectorOps(builder, width)
        v_bytes, v_words, v_dwords, suffix = ops.bytes, ops.words, ops.dwords, ops.suffix
        call, maddubs, splat_bytes = ops.call, ops.maddubs, ops.splat_bytes

        def madd_ones(words):
            return ops.madd(words, ir.Constant(v_words, [1] * (width // 2)))

        block = builder.gep(context.make_array(signature.args[0])(context, builder, quants_v).data, [w_start_v])

        def load(at):
            pointer = builder.gep(block, [ir.Constant(_I64, at)])
            return builder.load(builder.bitcast(pointer, v_bytes.as_pointer()), align=1)

        if nibbles:  # quads[q][part]: 4 loads of packed nibbles give quads k (low) and k + 4 (high)
            packed = [[load(64 * k + width * p) for p in range(parts)] for k in range(4)]
            quads = ([[builder.and_(v, splat_bytes(15)) for v in row] for row in packed]
                     + [[builder.lshr(v, splat_bytes(4)) for v in row] for row in packed])
        else:
            quads = [[load(64 * q + width * p) for p in range(parts)] for q in range(8)]
        if fifth_bits:  # quad q's 5th bits are bit q of each byte of the last 64: moved to bit 4
            high = [load(256 + width * p) for p in range(parts)]
            for q in range(8):
                for p in range(parts):
                    if q < 4:
                        bit = builder.shl(high[p], splat_bytes(4 - q))
                    elif q > 4:
                        bit = builder.lshr(high[p], splat_bytes(q - 4))
                    else:
                        bit = high[p]
                    quads[q][p] = builder.or_(quads[q][p], builder.and_(bit, splat_bytes(16)))
        if signed:
            if width == 64:  # for the select that stands in for vpsignb, which AVX-512 lacks
                negative = [[builder.icmp_signed("<", v, ir.Constant(v_bytes, [0] * width)) for v in row]
                            for row in quads]
            magnitudes = [[call(f"llvm.abs.v{width}i8", v_bytes, [v, ir.Constant(ir.IntType(1), 0)]) for v in row]
                          for row in quads]

        a_data = context.make_array(signature.args[2])(context, builder, a_v).data
        results = []
        for t in range(n_tokens):
            row_start = builder.add(a_start_v, builder.mul(stride_v, ir.Constant(_I64, t)))
            sums = [ir.Constant(v_dwords, [0] * (width // 4))] * parts
            words = [ir.Constant(v_words, [0] * (width // 2))] * parts
            for q in range(8):
                at = builder.gep(a_data, [builder.add(row_start, ir.Constant(_I64, 4 * q))])
                quad = builder.load(builder.bitcast(at, _I32.as_pointer()), align=1)
                a_dwords = splat(builder, quad, v_dwords)
                a_bytes = builder.bitcast(a_dwords, v_bytes)
                for p in range(parts):
                    if with_vnni:
                        sums[p] = call(f"llvm.x86.avx512.vpdpbusd.{suffix}", v_dwords,
                                       [sums[p], builder.bitcast(quads[q][p], v_dwords), a_dwords])
                    elif nibbles:
                        words[p] = builder.add(words[p], maddubs(quads[q][p], a_bytes))
                        if (q + 1) % quads_per_word_sum == 0 and q < 7:  # before an int16 sum could overflow
                            sums[p] = builder.add(sums[p], madd_ones(words[p]))
                            words[p] = ir.Constant(v_words, [0] * (width // 2))
                    else:
                        if width == 32:  # vpsignb: a negated where w < 0 (zeroed where w == 0, as |w| is)
                            signed_a = call("llvm.x86.avx2.psign.b", v_bytes, [a_bytes, quads[q][p]])
                        else:  # AVX-512 has no vpsignb
                            signed_a = builder.select(negative[q][p], builder.neg(a_bytes), a_bytes)
                        sums[p] = builder.add(sums[p], madd_ones(maddubs(magnitudes[q][p], signed_a)))
            if nibbles and not with_vnni:
                sums = [builder.add(sums[p], madd_ones(words[p])) for p in range(parts)]
            results.append(_as_vec16(builder, sums))
        return context.make_tuple(builder, signature.return_type, results)

    return sig, codegen


# ---------------------------------------------------------------- the K-quant tile kernel's dots, every int8 tier


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
        halves = [extend(builder.load(builder.bitcast(builder.gep(data, [at]), v_bytes.as_pointer()), align=1), v_words)
                  for at in args[1:3]]
        interleave = [i // 2 + LANES * (i % 2) for i in range(2 * LANES)]
        pairs = builder.shuffle_vector(halves[0], halves[1], ir.Constant(ir.VectorType(_I32, 2 * LANES), interleave))
        return builder.bitcast(pairs, _V16)

    return int32x16(array, types.intp, types.intp, signed), codegen


@intrinsic(prefer_literal=True)
def mins_dot(typingctx, min_pairs, m_start, sum_pairs, at, bits):
    """int32x16: lane r = sum over j < 8 of min(r, j) * sum32[j], by vpmaddwd of int16 pairs (one 512-bit or two
    256-bit ones per pair, by `bits`, a compile-time constant): min_pairs (int32, 1-D) at m_start + 16 j + r holds
    row r's mins of sub-blocks 2 j, 2 j + 1; sum_pairs (int32, 1-D) at at + j the activations' sums of those two
    sub-blocks' 32 values as one int16 pair (|sum| <= 32 x 127), low then high."""
    if not isinstance(bits, types.IntegerLiteral):
        return None
    width = bits.literal_value // 8

    def codegen(context, builder, signature, args):
        pair_data = context.make_array(signature.args[0])(context, builder, args[0]).data
        sum_data = context.make_array(signature.args[2])(context, builder, args[2]).data
        ops = _VectorOps(builder, width)
        v_words, v_dwords = ops.words, ops.dwords
        parts = 64 // width
        totals = [ir.Constant(v_dwords, [0] * (width // 4))] * parts
        for j in range(4):
            pair = builder.load(builder.gep(sum_data, [builder.add(args[3], ir.Constant(_I64, j))]))
            activation = builder.bitcast(splat(builder, pair, v_dwords), v_words)
            for p in range(parts):
                at = builder.add(args[1], ir.Constant(_I64, LANES * j + (width // 4) * p))
                mins = builder.load(builder.bitcast(builder.gep(pair_data, [at]), v_dwords.as_pointer()), align=4)
                totals[p] = builder.add(totals[p], ops.madd(builder.bitcast(mins, v_words), activation))
        return _as_vec16(builder, totals)

    return int32x16(min_pairs, types.intp, sum_pairs, types.intp, bits), codegen


class _SuperblockLane:
    """The IR of one lane of a K-quant tile's super-block: its quads, unpacked, and their products summed
    into int32 by scale pairs (for the two codegens below). quants: the lane's bytes from w_start; pairs:
    the int16 scale pairs from p_start, as superblock_tile_dot describes."""

    def __init__(self, builder, width: int, kind: int, with_vnni: bool, quants, w_start, pairs, p_start):
        self.builder, self.width, self.kind, self.with_vnni = builder, width, kind, with_vnni
        self.parts = 64 // width
        self.ops = _VectorOps(builder, width)
        self.quants, self.w_start, self.pairs, self.p_start = quants, w_start, pairs, p_start

    def load(self, base, at, vector_type, align):
        return self.builder.load(self.builder.bitcast(self.builder.gep(base, [at]), vector_type.as_pointer()), align=align)

    def at(self, start, offset):
        return self.builder.add(start, ir.Constant(_I64, offset))

    def weight_vector(self, v, p):
        return self.load(self.quants, self.at(self.w_start, 64 * v + self.width * p), self.ops.bytes, 1)

    def quad(self, q, p):
        """Quad q of the part p's rows: bytes, unsigned (Q4_K, Q5_K) or signed (Q6_K, its values less 32)."""
        builder, splat_bytes = self.builder, self.ops.splat_bytes
        packed = self.weight_vector(q // 2, p)
        value = builder.and_(packed, splat_bytes(15)) if q % 2 == 0 else builder.lshr(packed, splat_bytes(4))
        if self.kind == Q6_K:  # bits 2 (q % 4), + 1 of vector 4 + q // 4 move to bits 4, 5
            high, shift = self.weight_vector(4 + q // 4, p), 2 * (q % 4)
            if shift < 4:
                high = builder.shl(high, splat_bytes(4 - shift))
            elif shift > 4:
                high = builder.lshr(high, splat_bytes(shift - 4))
            return builder.sub(builder.or_(value, builder.and_(high, splat_bytes(48))), splat_bytes(32))
        if self.kind == Q5_K:  # bit q of vector 4 moves to bit 4
            fifth = self.weight_vector(4, p)
            bit = (builder.shl(fifth, splat_bytes(4 - q)) if q < 4
                   else builder.lshr(fifth, splat_bytes(q - 4)) if q > 4 else fifth)
            value = builder.or_(value, builder.and_(bit, splat_bytes(16)))
        return value

    def accumulate(self, acc, words, scale_pair):
        """acc + each int16 pair of words times scale_pair's, summed into int32 (vpdpwssd, or vpmaddwd + vpaddd)."""
        ops = self.ops
        if self.with_vnni:
            return ops.call(f"llvm.x86.avx512.vpdpwssd.{ops.suffix}", ops.dwords,
                            [acc, self.builder.bitcast(words, ops.dwords), self.builder.bitcast(scale_pair, ops.dwords)])
        return self.builder.add(acc, ops.madd(words, scale_pair))

    def scale_pairs(self, j):
        return [self.builder.bitcast(self.load(self.pairs, self.at(self.p_start, 16 * j + (self.width // 4) * p),
                                               self.ops.dwords, 4), self.ops.words)
                for p in range(self.parts)]

    def zeros(self):
        return [ir.Constant(self.ops.dwords, [0] * (self.width // 4)) for _ in range(self.parts)]


@intrinsic(prefer_literal=True)
def superblock_tile_dot(typingctx, quants, w_start, w_stride, pairs, p_start, p_stride, a, a_start, a_stride, steps, sums,
                        s_start, offsets, o_start, o_stride, bits, vnni, qtype, tokens, group):
    """Lane l of one super-block of `group` neighbouring 16-row K-quant tiles (superblock_tiles.py) against
    `tokens` activation rows, with ggml's float step: for each tile g, row t and weight row r,

        sums[s_start + (g * tokens + t) * 128 + r] += steps[16 (g * tokens + t) + r] * float(aux32[g, t, r]),
        aux32[g, t, r] = sum over quads Q < 8 and bytes i of sc(r, Q, i) . (quad Q of weight row r)[i] . (quad Q of a[t])[i]

    exactly ggml's aux32[l] (the products summed in int16 pairs by vpmaddubsw, each pair times its
    sub-block scale by vpmaddwd, or vpdpwssd where the tier has VNNI). Each activation quad is broadcast once
    for the group's 16 x `group` rows: on 512-bit tiers a broadcast costs about what a multiply does, and the
    registers hold two tiles' sums for 8 rows. quants (uint8, 1-D): tile g's lane bytes at w_start + g * w_stride.
    pairs (int32, 1-D): at p_start + g * p_stride + 16 j + r, row r's int16 scale pair for bytes 0, 1
    and 2, 3 (low, high) of quads 2 j and 2 j + 1 (Q4_K, Q5_K; j < 4) or of quad j (Q6_K). a (int8, 1-D):
    row t's super-block in quad order at a_start + t * a_stride, quad Q of lane l at 32 Q. steps, sums
    (float32, 1-D): d_w * d_a per tile, row and token, and the lane's float sums.

    vpmaddubsw multiplies unsigned by signed bytes. Q4_K's and Q5_K's values are unsigned and the
    activations signed: at most 2 x 31 x 127 an int16 pair, two quads' pairs added 15,748. Q6_K's values less 32 are signed, so its
    activations come biased, a + 128 (quantize_q8_k_quads(biased=True)), the unsigned operand: at most
    2 x 255 x 32 = 16,320. What the bias adds, 128 x sum of sc x (q - 32) per lane and row, is
    offsets[o_start + g * o_stride + r] (superblock_bias), subtracted before the float step. Neither saturates.
    For the other types `offsets` is not read. bits, vnni, qtype, tokens, group: compile-time constants as for
    tile_dot.
    """
    if not all(isinstance(ty, types.IntegerLiteral) for ty in (bits, vnni, qtype, tokens, group)):
        return None
    width = bits.literal_value // 8
    kind = qtype.literal_value
    n_tokens, n_tiles = tokens.literal_value, group.literal_value
    sig = types.void(quants, types.intp, types.intp, pairs, types.intp, types.intp, a, types.intp, types.intp, steps,
                     sums, types.intp, offsets, types.intp, types.intp, bits, vnni, qtype, tokens, group)

    def codegen(context, builder, signature, args):
        w_start_v, w_stride_v, p_start_v, p_stride_v, a_start_v, stride_v, s_start_v, o_start_v, o_stride_v = (
            args[i] for i in (1, 2, 4, 5, 7, 8, 11, 13, 14))

        def data(index):
            return context.make_array(signature.args[index])(context, builder, args[index]).data

        def offset(start, stride, g):
            return builder.add(start, builder.mul(stride, ir.Constant(_I64, g)))

        lanes = [_SuperblockLane(builder, width, kind, bool(vnni.literal_value), data(0),
                                 offset(w_start_v, w_stride_v, g), data(3), offset(p_start_v, p_stride_v, g))
                 for g in range(n_tiles)]
        lane = lanes[0]
        parts, load, at = lane.parts, lane.load, lane.at
        v_bytes, v_dwords = lane.ops.bytes, lane.ops.dwords
        v_floats = ir.VectorType(ir.FloatType(), width // 4)
        maddubs = lane.ops.maddubs
        a_data, step_data, sum_data, offset_data = data(6), data(9), data(10), data(12)

        def activation_quad(t, q):
            row_start = builder.add(a_start_v, builder.mul(stride_v, ir.Constant(_I64, t)))
            word = builder.load(builder.bitcast(builder.gep(a_data, [at(row_start, 32 * q)]), _I32.as_pointer()), align=1)
            return builder.bitcast(splat(builder, word, v_dwords), v_bytes)

        acc = [[lane.zeros() for _ in range(n_tiles)] for _ in range(n_tokens)]  # [t][g][part]
        if kind == Q6_K:  # a scale pair per quad: maddubs(a + 128, q - 32)
            for q in range(8):
                weights = [[tile.quad(q, p) for p in range(parts)] for tile in lanes]
                pair = [tile.scale_pairs(q) for tile in lanes]
                for t in range(n_tokens):
                    a_bytes = activation_quad(t, q)
                    for g in range(n_tiles):
                        for p in range(parts):
                            acc[t][g][p] = lanes[g].accumulate(acc[t][g][p], maddubs(a_bytes, weights[g][p]), pair[g][p])
        else:  # quads 2 c and 2 c + 1 share the scale pair (sc[2 c], sc[2 c + 1]): their int16 products added first
            for c in range(4):
                low = [[tile.quad(2 * c, p) for p in range(parts)] for tile in lanes]
                high = [[tile.quad(2 * c + 1, p) for p in range(parts)] for tile in lanes]
                pair = [tile.scale_pairs(c) for tile in lanes]
                for t in range(n_tokens):
                    a_low, a_high = activation_quad(t, 2 * c), activation_quad(t, 2 * c + 1)
                    for g in range(n_tiles):
                        for p in range(parts):
                            words = builder.add(maddubs(low[g][p], a_low), maddubs(high[g][p], a_high))
                            acc[t][g][p] = lanes[g].accumulate(acc[t][g][p], words, pair[g][p])
        for g in range(n_tiles):
            if kind == Q6_K:  # what the activations' bias added
                for p in range(parts):
                    bias = load(offset_data, at(offset(o_start_v, o_stride_v, g), (width // 4) * p), v_dwords, 4)
                    for t in range(n_tokens):
                        acc[t][g][p] = builder.sub(acc[t][g][p], bias)
            for t in range(n_tokens):  # ggml: sums[l] += d * aux32[l], d = x.d * y.d
                row = g * n_tokens + t
                for p in range(parts):
                    step = load(step_data, ir.Constant(_I64, 16 * row + (width // 4) * p), v_floats, 4)
                    where = at(s_start_v, 128 * row + (width // 4) * p)
                    total = load(sum_data, where, v_floats, 4)
                    total = builder.fadd(total, builder.fmul(step, builder.sitofp(acc[t][g][p], v_floats)))
                    builder.store(total, builder.bitcast(builder.gep(sum_data, [where]), v_floats.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic(prefer_literal=True)
def superblock_bias(typingctx, quants, w_start, pairs, p_start, bits, vnni):
    """int32x16: for lane l of one super-block of a 16-row Q6_K tile, lane r = 128 x sum over the lane's values
    of sc x (q - 32), what superblock_tile_dot's biased activations (a + 128) add to row r's aux32: the same
    vpmaddubsw (128 against q - 32, at most 2 x 128 x 32 an int16 pair) and scale pairs, so it is exact.
    Arguments as for superblock_tile_dot; bits, vnni compile-time constants."""
    if not all(isinstance(ty, types.IntegerLiteral) for ty in (bits, vnni)):
        return None
    width = bits.literal_value // 8

    def codegen(context, builder, signature, args):
        def data(index):
            return context.make_array(signature.args[index])(context, builder, args[index]).data

        lane = _SuperblockLane(builder, width, Q6_K, bool(vnni.literal_value), data(0), args[1], data(2), args[3])
        acc = lane.zeros()
        bias = lane.ops.splat_bytes(128)
        for q in range(8):
            pair = lane.scale_pairs(q)
            for p in range(lane.parts):
                acc[p] = lane.accumulate(acc[p], lane.ops.maddubs(bias, lane.quad(q, p)), pair[p])
        return _as_vec16(builder, acc)

    return int32x16(quants, types.intp, pairs, types.intp, bits, vnni), codegen
