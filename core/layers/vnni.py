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


_BYTES64 = ir.VectorType(ir.IntType(8), 64)


def _tile_dot(quad_vectors):
    """An intrinsic: one 32-value block of a 16-row tile (tiles.py) against 8 activation rows, as 8 int32x16
    (one per activation row, lane r = weight row r): sum over quads q < 8 and bytes i < 4 of
    w[r, q].byte[i] * a[t, 4 q + i]. quad_vectors(builder, block pointer) gives the 8 quads of the tile's 16
    rows as 512-bit vectors of unsigned bytes. Each activation quad is broadcast from memory (no register
    shuffles); the 8 rows are 8 independent vpdpbusd chains, enough to hide its latency.

    a (int8, 1-D): activation row t's block at a_start + t * a_stride.
    """

    @intrinsic
    def dot(typingctx, quants, w_start, a, a_start, a_stride):
        sig = types.UniTuple(int32x16, 8)(quants, types.intp, a, types.intp, types.intp)

        def codegen(context, builder, signature, args):
            quants_v, w_start_v, a_v, a_start_v, stride_v = args
            vpdpbusd = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_V16, [_V16, _V16, _V16]), "llvm.x86.avx512.vpdpbusd.512")
            block = builder.gep(context.make_array(signature.args[0])(context, builder, quants_v).data, [w_start_v])
            a_data = context.make_array(signature.args[2])(context, builder, a_v).data
            rows = [builder.add(a_start_v, builder.mul(stride_v, ir.Constant(_I64, t))) for t in range(8)]
            sums = [ir.Constant(_V16, [0] * LANES)] * 8
            for q, weights in enumerate(quad_vectors(builder, block)):
                for t, row in enumerate(rows):
                    at = builder.gep(a_data, [builder.add(row, ir.Constant(_I64, 4 * q))])
                    quad = builder.load(builder.bitcast(at, ir.IntType(32).as_pointer()), align=1)
                    sums[t] = builder.call(vpdpbusd, [sums[t], weights, splat(builder, quad, _V16)])
            return context.make_tuple(builder, signature.return_type, sums)

        return sig, codegen

    return dot


def _load64(builder, block, at: int):
    return builder.load(builder.bitcast(builder.gep(block, [ir.Constant(_I64, at)]), _BYTES64.as_pointer()), align=1)


def _tile_nibble_quads(builder, block):
    """Q4_0/Q4_1 tiles: 4 x 64 bytes, [k][row][4 bytes of nibbles]; the low nibbles are quad k, the high quad k + 4."""
    packed = [_load64(builder, block, 64 * k) for k in range(4)]
    low = [builder.and_(p, ir.Constant(_BYTES64, [15] * 64)) for p in packed]
    high = [builder.lshr(p, ir.Constant(_BYTES64, [4] * 64)) for p in packed]
    return [builder.bitcast(v, _V16) for v in low + high]


def _tile_byte_quads(builder, block):
    """Q8_0 tiles: 8 x 64 bytes, [q][row][4 bytes], already unsigned (+128) at repacking."""
    return [builder.bitcast(_load64(builder, block, 64 * q), _V16) for q in range(8)]


# a 16-row tile's block of Q4_0 / Q4_1 (nibbles) or Q8_0 (unsigned bytes) against 8 activation rows
dot_nibble_tile = _tile_dot(_tile_nibble_quads)
dot_byte_tile = _tile_dot(_tile_byte_quads)
