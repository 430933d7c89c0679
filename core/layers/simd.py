"""16-lane vectors as numba values: int32x16 and float32x16, LLVM's <16 x i32> and <16 x float>.

A numba array lives in memory, so a loop that keeps sums in one can never hold them in
registers (LLVM cannot prove the loop's other loads leave it alone). These types are values:
a loop that updates `acc = acc + x` keeps acc in a register, as a SIMD micro-kernel in C would.

    v = load16(array, i)         # array[i:i + 16] (int32/uint32 -> int32x16, float32 -> float32x16)
    h = load16_f16(array, i)     # array[i:i + 16] of float16 bits (uint16) -> float32x16
    store16(array, i, v)
    f = to_float(v)              # int32x16 -> float32x16, exact below 2^24
    acc = fma(x, w, acc)         # acc + x * w rounded once (x a float32 scalar, splat)
    z = zeros16()                # float32x16 of zeros
    acc = acc + (f * scale) * v2 # +, -, * lane by lane; a scalar operand applies to every lane

The arithmetic is plain IEEE lane by lane, with no fast-math flags: the same bits as the scalar
code written the same way.
"""

from __future__ import annotations

import operator

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic, models, overload, register_model

LANES = 16


class Vec16(types.Type):
    def __init__(self, element):
        self.element = element
        super().__init__(name=f"{element}x{LANES}")


int32x16 = Vec16(types.int32)
float32x16 = Vec16(types.float32)


@register_model(Vec16)
class _Vec16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        element = ir.IntType(32) if fe_type.element == types.int32 else ir.FloatType()
        super().__init__(dmm, fe_type, ir.VectorType(element, LANES))


def splat(builder, value, vector_type: ir.VectorType):
    """An IR vector with `value` in every lane."""
    one = builder.insert_element(ir.Constant(vector_type, None), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(one, ir.Constant(vector_type, None), ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES))


def element_pointer(context, builder, array_type, array, index, vector_type: ir.VectorType):
    """&array[index] (1-D, contiguous), as a pointer to a vector."""
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [index]), vector_type.as_pointer())


@intrinsic
def load16(typingctx, array, index):
    vec = int32x16 if array.dtype in (types.int32, types.uint32) else float32x16

    def codegen(context, builder, sig, args):
        vector_type = context.get_value_type(vec)
        return builder.load(element_pointer(context, builder, sig.args[0], args[0], args[1], vector_type), align=4)

    return vec(array, types.intp), codegen


@intrinsic
def load16_f16(typingctx, array, index):
    """array[index:index + 16] (uint16 holding float16 bits) as float32x16: one vcvtph2ps, exact."""
    def codegen(context, builder, sig, args):
        halves = element_pointer(context, builder, sig.args[0], args[0], args[1], ir.VectorType(ir.HalfType(), LANES))
        return builder.fpext(builder.load(halves, align=2), ir.VectorType(ir.FloatType(), LANES))

    return float32x16(array, types.intp), codegen


@intrinsic
def store16(typingctx, array, index, value):
    def codegen(context, builder, sig, args):
        vector_type = context.get_value_type(sig.args[2])
        builder.store(args[2], element_pointer(context, builder, sig.args[0], args[0], args[1], vector_type), align=4)
        return context.get_dummy_value()

    return types.void(array, types.intp, value), codegen


@intrinsic
def to_float(typingctx, value):
    def codegen(context, builder, sig, args):
        return builder.sitofp(args[0], ir.VectorType(ir.FloatType(), LANES))

    return float32x16(int32x16), codegen


def _lanewise(name: str):
    """An intrinsic for a + b, a - b or a * b with at least one vector operand (a scalar is splat)."""

    @intrinsic
    def op(typingctx, a, b):
        vec = a if isinstance(a, Vec16) else b

        def codegen(context, builder, sig, args):
            vector_type = context.get_value_type(vec)
            x, y = (
                value if isinstance(ty, Vec16) else splat(builder, context.cast(builder, value, ty, vec.element), vector_type)
                for value, ty in zip(args, sig.args)
            )
            if vec.element == types.float32:
                return {"add": builder.fadd, "sub": builder.fsub, "mul": builder.fmul}[name](x, y)
            return {"add": builder.add, "sub": builder.sub, "mul": builder.mul}[name](x, y)

        return vec(a, b), codegen

    return op


def _register(python_operator, name: str):
    lanewise = _lanewise(name)

    @overload(python_operator)
    def _overload(a, b):
        if isinstance(a, Vec16) or isinstance(b, Vec16):
            return lambda a, b: lanewise(a, b)


for _operator, _name in ((operator.add, "add"), (operator.sub, "sub"), (operator.mul, "mul")):
    _register(_operator, _name)


@intrinsic
def fma(typingctx, x, w, acc):
    """acc + x * w with one rounding (llvm.fma, vfmadd231ps): x a float32 scalar in every lane."""
    def codegen(context, builder, sig, args):
        vector_type = ir.VectorType(ir.FloatType(), LANES)
        fused = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vector_type, [vector_type] * 3), "llvm.fma.v16f32")
        return builder.call(fused, [splat(builder, args[0], vector_type), args[1], args[2]])

    return float32x16(types.float32, float32x16, float32x16), codegen


@intrinsic
def zeros16(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(ir.VectorType(ir.FloatType(), LANES), [0.0] * LANES)

    return float32x16(), codegen
