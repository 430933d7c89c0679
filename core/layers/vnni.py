"""AVX512-VNNI for numba: vpdpbusd (64 int8 multiply-adds in one instruction) and vpdpwssd (32 int16).

LLVM does not derive vpdpbusd from plain loops (its patterns stop at pmaddwd), and without it
the int16 kernels reach about half of llama.cpp's speed, so this one instruction comes through
an intrinsic. Integer sums are exact, so kernels built on it give the same bits as the portable
int16 ones; they run only where the CPU has the instruction (AVAILABLE).
"""

from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import config
from numba.core import cgutils
from numba.core.extending import intrinsic

from .simd import LANES, int32x16, splat

# what numba compiles for: the host, unless NUMBA_CPU_NAME / NUMBA_CPU_FEATURES say otherwise
_FEATURES = config.CPU_FEATURES if config.CPU_NAME else llvm.get_host_cpu_features().flatten()
AVAILABLE = "+avx512vnni" in (_FEATURES or "") and "+avx512vl" in (_FEATURES or "")  # VL: the 256-bit forms

_I64 = ir.IntType(64)
_V16 = ir.VectorType(ir.IntType(32), LANES)


@intrinsic
def dot_block_rows2(typingctx, a_quads, a_start, w_quads, w_start0, w_start1):
    """Two weight rows' 32-value blocks against 16 activation rows (lanes): a pair of int32x16,
    sum over quads q < 8 and bytes i < 4 of w_r[q].byte[i] * a[q, lane].byte[i].

    a_quads (uint32, 1-D): quad q of the 16 lanes at a_start + 16 q, 4 int8 activations of one
    lane per uint32. w_quads (uint32, 1-D): row r's 8 quads of unsigned weight bytes from
    w_start_r, each broadcast to every lane. Each activation load serves both rows; two chains
    per row hide vpdpbusd's latency.
    """
    sig = types.UniTuple(int32x16, 2)(a_quads, types.intp, w_quads, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        a_arr, a_start_v, w_arr, w_start0_v, w_start1_v = args
        vpdpbusd = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_V16, [_V16, _V16, _V16]), "llvm.x86.avx512.vpdpbusd.512")
        a_data = context.make_array(signature.args[0])(context, builder, a_arr).data
        w_data = context.make_array(signature.args[2])(context, builder, w_arr).data
        sums = [[ir.Constant(_V16, [0] * LANES)] * 2 for _ in range(2)]
        for q in range(8):
            a_at = builder.add(a_start_v, ir.Constant(_I64, LANES * q))
            a_vec = builder.load(builder.bitcast(builder.gep(a_data, [a_at]), _V16.as_pointer()), align=4)
            for row, w_start in enumerate((w_start0_v, w_start1_v)):
                quad = builder.load(builder.gep(w_data, [builder.add(w_start, ir.Constant(_I64, q))]))
                sums[row][q % 2] = builder.call(vpdpbusd, [sums[row][q % 2], splat(builder, quad, _V16), a_vec])
        rows = [builder.add(chains[0], chains[1]) for chains in sums]
        return context.make_tuple(builder, signature.return_type, rows)

    return sig, codegen


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


_V8 = ir.VectorType(ir.IntType(32), 8)
_BYTES16 = ir.VectorType(ir.IntType(8), 16)
_BYTES32 = ir.VectorType(ir.IntType(8), 32)


def _row_dot(weight_bytes):
    """An intrinsic: sum over 32 values of w * a, w from weight_bytes(builder, row pointer) (32 u8),
    a the 32 int8 activations of one row from a_start, with one 256-bit vpdpbusd and a lane sum."""

    @intrinsic
    def dot(typingctx, row, w_start, a_row, a_start):
        sig = types.int32(row, types.intp, a_row, types.intp)

        def codegen(context, builder, signature, args):
            row_v, w_start_v, a_v, a_start_v = args
            vpdpbusd = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_V8, [_V8, _V8, _V8]), "llvm.x86.avx512.vpdpbusd.256")
            reduce_add = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.IntType(32), [_V8]), "llvm.vector.reduce.add.v8i32")
            w_data = context.make_array(signature.args[0])(context, builder, row_v).data
            a_data = context.make_array(signature.args[2])(context, builder, a_v).data
            w_vec = builder.bitcast(weight_bytes(builder, builder.gep(w_data, [w_start_v])), _V8)
            a_vec = builder.load(builder.bitcast(builder.gep(a_data, [a_start_v]), _V8.as_pointer()), align=1)
            return builder.call(reduce_add, [builder.call(vpdpbusd, [ir.Constant(_V8, [0] * 8), w_vec, a_vec])])

        return sig, codegen

    return dot


def _nibbles(builder, at):
    """16 bytes of nibbles -> 32 u8: low nibbles are values 0-15, high nibbles 16-31."""
    packed = builder.load(builder.bitcast(at, _BYTES16.as_pointer()), align=1)
    low = builder.and_(packed, ir.Constant(_BYTES16, [15] * 16))
    high = builder.lshr(packed, ir.Constant(_BYTES16, [4] * 16))
    return builder.shuffle_vector(low, high, ir.Constant(ir.VectorType(ir.IntType(32), 32), list(range(32))))


def _flipped_bytes(builder, at):
    """32 int8 -> 32 u8 plus 128 (a flipped top bit)."""
    values = builder.load(builder.bitcast(at, _BYTES32.as_pointer()), align=1)
    return builder.xor(values, ir.Constant(_BYTES32, [0x80] * 32))


# one block of Q4_0/Q4_1 (nibbles from w_start) or Q8_0 (int8 from w_start, +128) against one activation row
dot_nibbles_row = _row_dot(_nibbles)
dot_flipped_bytes_row = _row_dot(_flipped_bytes)


_V8_ZERO = ir.Constant(_V8, [0] * 8)
_WIDEN = ir.Constant(ir.VectorType(ir.IntType(32), LANES), list(range(LANES)))  # 8 lanes + 8 zeros -> 16


def _quads_rows2(weight_quad):
    """An intrinsic: two weight rows' 32-value blocks against up to 8 activation rows, with each weight quad
    decoded in registers straight from the row's bytes (no decoded copy): a pair of int32x16 whose lanes 8-15
    are zero. weight_quad(builder, row pointer, q) gives quad q (4 unsigned bytes) of the block as an i32.

    a_quads (uint32, 1-D): the quad-groups layout (activation.py), quad q of lanes 0-7 at a_start + 16 q.
    With 256-bit vpdpbusd, two of which issue per cycle where 512-bit ones issue one: for up to 8 rows this
    does the same sums as dot_block_rows2 in half the multiply work, and skips its decode-to-memory pass.
    """

    @intrinsic
    def dot(typingctx, a_quads, a_start, row0, w_start0, row1, w_start1):
        sig = types.UniTuple(int32x16, 2)(a_quads, types.intp, row0, types.intp, row1, types.intp)

        def codegen(context, builder, signature, args):
            a_arr, a_start_v, row0_v, w0_v, row1_v, w1_v = args
            vpdpbusd = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_V8, [_V8, _V8, _V8]), "llvm.x86.avx512.vpdpbusd.256")
            a_data = context.make_array(signature.args[0])(context, builder, a_arr).data
            rows = [builder.gep(context.make_array(signature.args[k])(context, builder, row).data, [start])
                    for k, row, start in ((2, row0_v, w0_v), (4, row1_v, w1_v))]
            sums = [[_V8_ZERO] * 4 for _ in rows]  # four chains per row: vpdpbusd's latency is hidden
            for q in range(8):
                a_at = builder.add(a_start_v, ir.Constant(_I64, LANES * q))
                a_vec = builder.load(builder.bitcast(builder.gep(a_data, [a_at]), _V8.as_pointer()), align=4)
                for r, row in enumerate(rows):
                    one = builder.insert_element(ir.Constant(_V8, None), weight_quad(builder, row, q),
                                                 ir.Constant(ir.IntType(32), 0))
                    quad = builder.shuffle_vector(one, ir.Constant(_V8, None), _V8_ZERO)  # lane 0 everywhere
                    sums[r][q % 4] = builder.call(vpdpbusd, [sums[r][q % 4], quad, a_vec])
            wide = [builder.shuffle_vector(builder.add(builder.add(s0, s1), builder.add(s2, s3)), _V8_ZERO, _WIDEN)
                    for s0, s1, s2, s3 in sums]
            return context.make_tuple(builder, signature.return_type, wide)

        return sig, codegen

    return dot


def _u32_at(builder, row, at: int):
    return builder.load(builder.bitcast(builder.gep(row, [ir.Constant(_I64, at)]), ir.IntType(32).as_pointer()),
                        align=1)


def _nibble_quad(builder, row, q: int):
    """Quad q of 16 bytes of nibbles: values 4q..4q+3 are the low nibbles of bytes 4q.. (q < 4), else the high
    nibbles of bytes 4(q - 4).."""
    word = _u32_at(builder, row, 4 * (q % 4))
    if q >= 4:
        word = builder.lshr(word, ir.Constant(ir.IntType(32), 4))
    return builder.and_(word, ir.Constant(ir.IntType(32), 0x0F0F0F0F))


def _flipped_byte_quad(builder, row, q: int):
    """Quad q of 32 int8 values, each plus 128 (a flipped top bit) to be unsigned."""
    return builder.xor(_u32_at(builder, row, 4 * q), ir.Constant(ir.IntType(32), 0x80808080 - (1 << 32)))


# two rows' blocks of Q4_0 / Q4_1 (nibbles from w_start) or Q8_0 (int8 from w_start, +128) against 8 rows
dot_nibbles_rows2_8 = _quads_rows2(_nibble_quad)
dot_flipped_bytes_rows2_8 = _quads_rows2(_flipped_byte_quad)
