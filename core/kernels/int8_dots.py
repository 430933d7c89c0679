"""Integer dot products of int8 blocks for numba, as x86 intrinsics, one form per CPU tier (cpu.py).

LLVM does not derive vpdpbusd (AVX512-VNNI, AVX-VNNI: 4 u8 x s8 products summed into each int32 lane)
from plain loops, nor vpmaddubsw + vpmaddwd (AVX2, AVX-512BW: ggml's mul_sum_i8_pairs), and without
them the int16 kernels reach about half of llama.cpp's speed, so they come through intrinsics. Integer
sums are exact and none of these saturates on the values given to it, so every form gives the same
sums, the same as the portable kernels'.

- `tile_dot(..., bits, vnni, qtype, tokens, begins, ...)`: a 16-row tile's block (tiles.py) against several
  activation rows, each row's sums begun at 0 or at a given int32, for the tile kernel (tile_kernels.py), on every
  tier with int8 dots.

The K-quants' super-block dots, built from the same vector operations (VectorOps), are superblock_dots.py's.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from miro.core.kernels.quant_blocks import HAS_FIFTH_BITS, KVALUES_MXFP4, MXFP4, MXFP4_BIAS, Q8_0
from miro.core.kernels.simd import LANES, int32x16, splat

_I64 = ir.IntType(64)
_V16 = ir.VectorType(ir.IntType(32), LANES)


# ---------------------------------------------------------------- the tile kernel's dots, every int8 tier

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)


class VectorOps:
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
            self.builder.module, ir.FunctionType(result, [op.type for op in operands]), name
        )
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

    def lookup(self, table: list[int], indices):
        """vpshufb: each byte of `indices` (0..15) replaced by table[index], the 16-byte table in every 128-bit lane
        (ggml's IQ4_NL and MXFP4 decoding)."""
        name = "llvm.x86.avx512.pshuf.b.512" if self.width == 64 else "llvm.x86.avx2.pshuf.b"
        return self.call(name, self.bytes, [ir.Constant(self.bytes, table * (self.width // 16)), indices])


def as_vec16(builder, parts):
    """One int32x16 from a register width's parts: itself on 512-bit tiers, two 8-lane halves joined on 256-bit ones."""
    if len(parts) == 1:
        return parts[0]
    return builder.shuffle_vector(parts[0], parts[1], ir.Constant(_V16, list(range(LANES))))


def tile_signed_bytes(qtype: int, vnni: bool) -> bool:
    """Whether a Q8_0 tile keeps the file's signed bytes (vpmaddubsw tiers: |w| and the sign move to a, as ggml
    does) rather than w + 128 (vpdpbusd tiers, whose unsigned operand is then the weights as they are)."""
    return qtype == Q8_0 and not vnni


@intrinsic(prefer_literal=True)
def tile_dot(
    typingctx, quants, w_start, a, a_start, a_stride, bits, vnni, qtype, tokens, begins, init, i_start, i_stride
):
    """`tokens` int32x16 sums of one 32-value block of a 16-row tile (_tile_dot), each begun at 0, or where `begins`
    (a compile-time constant) is 1 at init[i_start + t * i_stride] (int32, 1-D; t the activation row) in every
    lane: the tile kernel's offset x the activations' sum, and its float bias (tile_kernels.py), at no cost on VNNI
    tiers (a broadcast load in place of a zeroing)."""
    if not isinstance(begins, types.IntegerLiteral):
        return None
    return _tile_dot(quants, a, bits, vnni, qtype, tokens, begins, init)


def _tile_dot(quants, a, bits, vnni, qtype, tokens, begins, init):
    """One 32-value block of a 16-row tile (tiles.py) against `tokens` activation rows, as `tokens` int32x16
    (one per activation row, lane r = weight row r): sum over quads q < 8 and bytes i < 4 of
    w[r, q].byte[i] * a[t, 4 q + i], the tile's unsigned bytes as they are (the caller adds the offset of a
    biased layout).

    quants (uint8, 1-D): the block at w_start, [k][row][4 bytes] (Q4_0/Q4_1/MXFP4: 4 x 64 bytes of nibbles, low
    nibbles quad k, high quad k + 4, MXFP4's codes looked up as KVALUES_MXFP4 + 12 by vpshufb; Q5_0/Q5_1: the same and 64 bytes of 5th bits, bit q of byte i quad q's;
    Q8_0: 8 x 64 bytes). a (int8, 1-D): activation row t's block at a_start + t * a_stride. Each activation
    quad is broadcast to every row; the weight vectors are loaded once for all the rows.

    bits, vnni, qtype, tokens: compile-time constants. bits 512: one vector per 16 rows; 256: two halves of
    8 rows. vnni: vpdpbusd; else vpmaddubsw into int16 pairs (Q4: 8 quads summed in int16, at most
    8 x 2 x 15 x 127 = 30,480; Q5: 4 quads, at most 4 x 2 x 31 x 127 = 31,496; MXFP4: 4 quads, at most
    4 x 2 x 24 x 127 = 24,384; Q8_0: |w| against a with w's
    sign, at most 2 x 128 x 127 = 32,512 a quad) then vpmaddwd by ones into int32.
    """
    if not all(isinstance(ty, types.IntegerLiteral) for ty in (bits, vnni, qtype, tokens)):
        return None  # numba then retries with the constants as literals
    width = bits.literal_value // 8  # bytes per vector
    with_vnni = bool(vnni.literal_value)
    nibbles = qtype.literal_value != Q8_0
    fifth_bits = qtype.literal_value in HAS_FIFTH_BITS
    looked_up = qtype.literal_value == MXFP4
    quads_per_word_sum = 4 if fifth_bits or looked_up else 8  # quads whose vpmaddubsw pairs an int16 sum holds
    signed = tile_signed_bytes(qtype.literal_value, with_vnni)
    n_tokens = tokens.literal_value
    operands = [quants, types.intp, a, types.intp, types.intp, bits, vnni, qtype, tokens, begins, init]
    from_init = bool(begins.literal_value)
    sig = types.UniTuple(int32x16, n_tokens)(*operands, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        quants_v, w_start_v, a_v, a_start_v, stride_v = args[:5]
        parts = 64 // width
        ops = VectorOps(builder, width)
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
            quads = [[builder.and_(v, splat_bytes(15)) for v in row] for row in packed] + [
                [builder.lshr(v, splat_bytes(4)) for v in row] for row in packed
            ]
            if looked_up:  # MXFP4's codes to their values + 12: unsigned, so the offset -12 x sum(a) gives ggml's sum
                table = [int(k) + MXFP4_BIAS for k in KVALUES_MXFP4]
                quads = [[ops.lookup(table, v) for v in row] for row in quads]
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
                negative = [
                    [builder.icmp_signed("<", v, ir.Constant(v_bytes, [0] * width)) for v in row] for row in quads
                ]
            magnitudes = [
                [call(f"llvm.abs.v{width}i8", v_bytes, [v, ir.Constant(ir.IntType(1), 0)]) for v in row]
                for row in quads
            ]

        a_data = context.make_array(signature.args[2])(context, builder, a_v).data
        if from_init:
            init_data = context.make_array(signature.args[10])(context, builder, args[10]).data
        results = []
        for t in range(n_tokens):
            row_start = builder.add(a_start_v, builder.mul(stride_v, ir.Constant(_I64, t)))
            if not from_init:
                sums = [ir.Constant(v_dwords, [0] * (width // 4))] * parts
            else:
                at = builder.add(args[11], builder.mul(args[12], ir.Constant(_I64, t)))
                sums = [splat(builder, builder.load(builder.gep(init_data, [at])), v_dwords)] * parts
            words = [ir.Constant(v_words, [0] * (width // 2))] * parts
            for q in range(8):
                at = builder.gep(a_data, [builder.add(row_start, ir.Constant(_I64, 4 * q))])
                quad = builder.load(builder.bitcast(at, _I32.as_pointer()), align=1)
                a_dwords = splat(builder, quad, v_dwords)
                a_bytes = builder.bitcast(a_dwords, v_bytes)
                for p in range(parts):
                    if with_vnni:
                        sums[p] = call(
                            f"llvm.x86.avx512.vpdpbusd.{suffix}",
                            v_dwords,
                            [sums[p], builder.bitcast(quads[q][p], v_dwords), a_dwords],
                        )
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
            results.append(as_vec16(builder, sums))
        return context.make_tuple(builder, signature.return_type, results)

    return sig, codegen
