"""16-lane rounding, narrowing and comparisons (simd.py's vectors) for the activation quantizers
(quantize_activations.py): float lanes to integers and int8 bytes, the integer sum of the lanes, and max/min as one
compare-and-pick each (simd.max16/hmax keep llvm.maxnum's rule of skipping a NaN, which costs x86 two more
instructions per vector).

    i = round_away16(v)          # C's roundf lane by lane (halves away from zero) -> int32x16
    i = to_int(v)                # float32x16 -> int32x16, truncated toward zero
    store16_int8(array, i, n)    # the low byte of each lane of an int32x16 into array[i:i + 16] (int8/uint8)
    n = hsum_int(n)              # the sum of an int32x16's lanes
    m = larger16(v, u)           # v if v > u else u lane by lane (u may be a scalar): one vmaxps; smaller16 too
    m = hlargest(v)              # the largest lane by larger16 (hsmallest: the smallest)
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic

from miro.core.kernels.simd import (
    LANES,
    element_pointer,
    f32x16_constant,
    float32x16,
    halves_tree,
    int32x16,
    operand16,
    vector_call,
)

# The float32 just below 0.5: v + copysign(it, v), rounded to nearest even, then truncated, is C's roundf(v)
# for every float32 (0.5 + it rounds up to 1, 0.49999997 + it stays below 1); LLVM lowers llvm.round so on x86.
_JUST_BELOW_HALF = 0.4999999701976776


@intrinsic
def round_away16(typingctx, value):
    """C's roundf lane by lane (halves away from zero), as int32x16: fptosi(v + copysign(0.5 - 2^-25, v)), one
    add, two bit operations and one truncating conversion. Lanes whose rounded value is outside int32, or NaN,
    are undefined: clamp them first."""

    def codegen(context, builder, sig, args):
        vf = ir.VectorType(ir.FloatType(), LANES)
        half = vector_call(builder, "llvm.copysign.v16f32", vf, [f32x16_constant(_JUST_BELOW_HALF), args[0]])
        return builder.fptosi(builder.fadd(args[0], half), ir.VectorType(ir.IntType(32), LANES))

    return int32x16(float32x16), codegen


@intrinsic
def to_int(typingctx, value):
    """float32x16 -> int32x16 by truncation toward zero (exact for whole numbers); out-of-range or NaN lanes are
    undefined."""

    def codegen(context, builder, sig, args):
        return builder.fptosi(args[0], ir.VectorType(ir.IntType(32), LANES))

    return int32x16(float32x16), codegen


@intrinsic
def store16_int8(typingctx, array, index, value):
    """array[index:index + 16] = the low byte of each lane of value (int32x16; array of int8 or uint8): vpmovdb
    on AVX-512, packs and a shuffle on AVX2."""

    def codegen(context, builder, sig, args):
        v8 = ir.VectorType(ir.IntType(8), LANES)
        narrow = builder.trunc(args[2], v8)
        builder.store(narrow, element_pointer(context, builder, sig.args[0], args[0], args[1], v8), align=1)
        return context.get_dummy_value()

    return types.void(array, types.intp, int32x16), codegen


@intrinsic
def hsum_int(typingctx, value):
    """The sum of the 16 lanes of an int32x16 (wrapping as int32 does)."""

    def codegen(context, builder, sig, args):
        return halves_tree(builder, args[0], lambda a, b, width: builder.add(a, b))

    return types.int32(int32x16), codegen


def _pick(builder, a, b, predicate: str):
    """a if (a predicate b) else b: one vmaxps / vminps on x86 (b when either is NaN)."""
    return builder.select(builder.fcmp_ordered(predicate, a, b), a, b)


def _picking(typingctx, a, b, predicate: str):
    """The signature and codegen of larger16 / smaller16."""

    def codegen(context, builder, sig, args):
        x, y = (operand16(context, builder, value, ty) for value, ty in zip(args, sig.args))
        return _pick(builder, x, y, predicate)

    return float32x16(a, b), codegen


@intrinsic
def larger16(typingctx, a, b):
    """a if a > b else b lane by lane (a float32x16, b one or a float32 splat): one vmaxps; b when either is NaN."""
    return _picking(typingctx, a, b, ">")


@intrinsic
def smaller16(typingctx, a, b):
    """a if a < b else b lane by lane (a float32x16, b one or a float32 splat): one vminps; b when either is NaN."""
    return _picking(typingctx, a, b, "<")


@intrinsic
def hlargest(typingctx, value):
    """The largest of the 16 lanes, by larger16 half against half (finite lanes: the same as hmax)."""

    def codegen(context, builder, sig, args):
        return halves_tree(builder, args[0], lambda a, b, width: _pick(builder, a, b, ">"))

    return types.float32(float32x16), codegen


@intrinsic
def hsmallest(typingctx, value):
    """The smallest of the 16 lanes, by smaller16 half against half."""

    def codegen(context, builder, sig, args):
        return halves_tree(builder, args[0], lambda a, b, width: _pick(builder, a, b, "<"))

    return types.float32(float32x16), codegen
