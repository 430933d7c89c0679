"""Integer dot products of int8 blocks for numba, as x86 intrinsics, one form per CPU tier (cpu.py).

LLVM does not derive vpdpbusd (AVX512-VNNI, AVX-VNNI: 4 u8 x s8 products summed into each int32 lane)
from plain loops, nor vpmaddubsw + vpmaddwd (AVX2, AVX-512BW: ggml's mul_sum_i8_pairs), and without
them the int16 kernels reach about half of llama.cpp's speed, so they come through intrinsics. Integer
sums are exact and none of these saturates on the values given to it, so every form gives the same
sums, the same as the portable kernels'.

- `dot_superblock_lanes8`: the 512-bit VNNI K-quant lanes kernel's dots (vnni_kernels.py).
- `tile_dot(..., bits, vnni, qtype, tokens)`: a 16-row tile's block (tiles.py) against several activation
  rows, for the tile kernel (tile_kernels.py), on every tier with int8 dots.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from .quant_blocks import HAS_FIFTH_BITS, Q8_0
from .simd import LANES, int32x16, splat

_I64 = ir.IntType(64)
_V16 = ir.VectorType(ir.IntType(32), LANES)


@intrinsic
def dot_superblock_lanes8(typingctx, a_pairs, a_start, w_pairs, w_start):
    """One weight row's 256-value super-block against 16 activation rows: ggml's 8 lane sums as
    8 int32x16, lane l = sum over j < 16 of the int16 pair products w[l, j] . a[l, j, row].

    a_pairs (int32, 1-D): pair j of ggml lane l for the 16 activation rows at
    a_start + (16 l + j) * 16, two int16 values per int32. w_pairs (int32, 1-D): the weight
    pairs (scale-folded int16) at w_start + 16 l + j, each broadcast to the 16 rows.
    """
    sig = types.UniTuple(int32x16, 8)(a_pairs, types.intp, w_pairs, types.intp)

    def codegen(context, builder, signature, args):
        a_arr, a_start_v, w_arr, w_start_v = args
        vpdpwssd = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_V16, [_V16, _V16, _V16]), "llvm.x86.avx512.vpdpwssd.512")
        a_data = context.make_array(signature.args[0])(context, builder, a_arr).data
        w_data = context.make_array(signature.args[2])(context, builder, w_arr).data
        lanes = []
        for lane in range(8):
            acc = ir.Constant(_V16, [0] * LANES)
            for j in range(16):
                a_at = builder.add(a_start_v, ir.Constant(_I64, (16 * lane + j) * LANES))
                a_vec = builder.load(builder.bitcast(builder.gep(a_data, [a_at]), _V16.as_pointer()), align=4)
                pair = builder.load(builder.gep(w_data, [builder.add(w_start_v, ir.Constant(_I64, 16 * lane + j))]))
                acc = builder.call(vpdpwssd, [acc, splat(builder, pair, _V16), a_vec])
            lanes.append(acc)
        return context.make_tuple(builder, signature.return_type, lanes)

    return sig, codegen


# ---------------------------------------------------------------- the tile kernel's dots, every int8 tier

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)


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
        v_bytes, v_words, v_dwords = (ir.VectorType(_I8, width), ir.VectorType(_I16, width // 2),
                                      ir.VectorType(_I32, width // 4))
        suffix = "512" if width == 64 else "256"

        def call(name, result, operands):
            function = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(result, [op.type for op in operands]), name)
            return builder.call(function, operands)

        def maddubs(u, s):
            name = "llvm.x86.avx512.pmaddubs.w.512" if width == 64 else "llvm.x86.avx2.pmadd.ub.sw"
            return call(name, v_words, [u, s])

        def madd_ones(words):
            name = "llvm.x86.avx512.pmaddw.d.512" if width == 64 else "llvm.x86.avx2.pmadd.wd"
            return call(name, v_dwords, [words, ir.Constant(v_words, [1] * (width // 2))])

        block = builder.gep(context.make_array(signature.args[0])(context, builder, quants_v).data, [w_start_v])

        def load(at):
            pointer = builder.gep(block, [ir.Constant(_I64, at)])
            return builder.load(builder.bitcast(pointer, v_bytes.as_pointer()), align=1)

        def splat_bytes(value):
            return ir.Constant(v_bytes, [value] * width)

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
            if parts == 1:
                results.append(sums[0])
            else:
                results.append(builder.shuffle_vector(sums[0], sums[1], ir.Constant(_V16, list(range(LANES)))))
        return context.make_tuple(builder, signature.return_type, results)

    return sig, codegen
