"""16-lane vectors as numba values: int32x16 and float32x16, LLVM's <16 x i32> and <16 x float>.

A numba array lives in memory, so a loop that keeps sums in one can never hold them in
registers (LLVM cannot prove the loop's other loads leave it alone). These types are values:
a loop that updates `acc = acc + x` keeps acc in a register, as a SIMD micro-kernel in C would.

    v = load16(array, i)         # array[i:i + 16] (int32/uint32 -> int32x16, float32 -> float32x16)
    h = load16_f16(array, i)     # array[i:i + 16] of float16 bits (uint16) -> float32x16
    e = load16_e8m0(array, i)    # array[i:i + 16] of E8M0 bytes (in uint16) -> float32x16 of 2^(e - 128)
    store16(array, i, v)
    f = to_float(v)              # int32x16 -> float32x16, exact below 2^24
    acc = fma(x, w, acc)         # acc + x * w rounded once (x a float32 scalar, splat)
    z = zeros16()                # float32x16 of zeros
    n = int_zeros16()            # int32x16 of zeros
    acc = acc + (f * scale) * v2 # +, -, *, / lane by lane (/: float32 only); a scalar operand applies to every lane
    e = exp16(v)                 # e^v lane by lane (a polynomial, within 2 ulp; below -87.3: 2^-126)
    a = abs16(v)                 # |v| lane by lane
    m = max16(v, u)              # the larger of v and u lane by lane
    y = exp1(x)                  # the same for one float32
    v = splat16(x); x = lane0(v) # a float32 in every lane; lane 0 of a float32x16
    m = hmax(v); s = hsum(v)     # the largest lane; the sum of the lanes, always in the same tree order
    s0, s1, s2, s3 = hsum4(a, b, c, d)  # hsum (and hmax4: hmax) of four vectors in one tree, the same bits
    w = keep_lanes(v, a, b, f)   # lanes a..b-1 of v, the others set to the scalar f
    prefetch_l2(array, i)        # ask for the cache line holding array[i] into L2 (a hint: it never faults)
    prefetch_l2_lines(b, i, j)   # the same for each 64-byte line of the byte array b[i:j] (j clipped)

The arithmetic is plain IEEE lane by lane, with no fast-math flags: the same bits as the scalar
code written the same way. Rounding to integers, narrowing to bytes and compare-and-pick, for the activation
quantizers: simd_narrowing.py.
"""

from __future__ import annotations

import operator

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.extending import intrinsic, models, overload, register_model

from miro.core.kernels.halfs import widen_halves

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
    mask = ir.Constant(ir.VectorType(ir.IntType(32), vector_type.count), [0] * vector_type.count)
    return builder.shuffle_vector(one, ir.Constant(vector_type, None), mask)


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
        halves = element_pointer(context, builder, sig.args[0], args[0], args[1], ir.VectorType(ir.IntType(16), LANES))
        return widen_halves(builder, builder.load(halves, align=2))

    return float32x16(array, types.intp), codegen


@intrinsic
def load16_e8m0(typingctx, array, index):
    """array[index:index + 16] (uint16 each holding an E8M0 byte e, MXFP4's scale) as float32x16 of 2^(e - 128),
    ggml's GGML_E8M0_TO_FP32_HALF bit for bit: the float's bits are (e - 1) << 23, or 0x00200000 << e for the
    denormals e < 2."""

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        v_i32 = ir.VectorType(i32, LANES)
        halves = element_pointer(context, builder, sig.args[0], args[0], args[1], ir.VectorType(ir.IntType(16), LANES))
        e = builder.zext(builder.load(halves, align=2), v_i32)
        normal = builder.shl(builder.sub(e, ir.Constant(v_i32, [1] * LANES)), ir.Constant(v_i32, [23] * LANES))
        denormal = builder.shl(ir.Constant(v_i32, [0x00200000] * LANES), e)
        small = builder.icmp_unsigned("<", e, ir.Constant(v_i32, [2] * LANES))
        return builder.bitcast(builder.select(small, denormal, normal), ir.VectorType(ir.FloatType(), LANES))

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
                value
                if isinstance(ty, Vec16)
                else splat(builder, context.cast(builder, value, ty, vec.element), vector_type)
                for value, ty in zip(args, sig.args)
            )
            if vec.element == types.float32:
                return {"add": builder.fadd, "sub": builder.fsub, "mul": builder.fmul, "div": builder.fdiv}[name](x, y)
            return {"add": builder.add, "sub": builder.sub, "mul": builder.mul}[name](x, y)

        return vec(a, b), codegen

    return op


def _register(python_operator, name: str):
    lanewise = _lanewise(name)

    @overload(python_operator)
    def _overload(a, b):
        if isinstance(a, Vec16) or isinstance(b, Vec16):
            return lambda a, b: lanewise(a, b)


for _operator, _name in (
    (operator.add, "add"),
    (operator.sub, "sub"),
    (operator.mul, "mul"),
    (operator.truediv, "div"),
):
    _register(_operator, _name)


@intrinsic
def fma(typingctx, x, w, acc):
    """acc + x * w with one rounding (llvm.fma, vfmadd231ps): x a float32 scalar in every lane."""

    def codegen(context, builder, sig, args):
        vector_type = ir.VectorType(ir.FloatType(), LANES)
        fused = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vector_type, [vector_type] * 3), "llvm.fma.v16f32"
        )
        return builder.call(fused, [splat(builder, args[0], vector_type), args[1], args[2]])

    return float32x16(types.float32, float32x16, float32x16), codegen


@intrinsic
def zeros16(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(ir.VectorType(ir.FloatType(), LANES), [0.0] * LANES)

    return float32x16(), codegen


@intrinsic
def int_zeros16(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)

    return int32x16(), codegen


def f32x16_constant(value: float) -> ir.Constant:
    return ir.Constant(ir.VectorType(ir.FloatType(), LANES), [value] * LANES)


def vector_call(builder, name: str, vector_type, args):
    """A call to the LLVM intrinsic `name` whose arguments and result are all of vector_type."""
    function = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vector_type, [vector_type] * len(args)), name
    )
    return builder.call(function, args)


# Cephes' expf: e^x = 2^n * e^r with n = round(x / ln 2) and |r| <= ln 2 / 2, e^r a degree-7 polynomial.
_EXP_HI, _EXP_LO = 88.3762626647949, -87.3365478515625  # beyond: inf; below: 2^n leaves the normal floats
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4  # ln 2 in two parts, so that x - n ln 2 keeps its low bits
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)


@intrinsic
def exp16(typingctx, value):
    """e^value lane by lane, within 2 ulp of the exact value; -inf and anything below -87.3 give 2^-126, not 0."""

    def codegen(context, builder, sig, args):
        vf = ir.VectorType(ir.FloatType(), LANES)
        vi = ir.VectorType(ir.IntType(32), LANES)
        # clamped by compare-and-pick: minnum then maxnum's results (a NaN becomes _EXP_HI either way) in one
        # vminps and one vmaxps, where llvm.minnum/maxnum cost three instructions each on x86
        hi, lo = f32x16_constant(_EXP_HI), f32x16_constant(_EXP_LO)
        x = builder.select(builder.fcmp_ordered("<", args[0], hi), args[0], hi)
        x = builder.select(builder.fcmp_ordered(">", x, lo), x, lo)
        n = vector_call(builder, "llvm.rint.v16f32", vf, [builder.fmul(x, f32x16_constant(1.44269504088896341))])
        r = vector_call(builder, "llvm.fma.v16f32", vf, [n, f32x16_constant(-_LN2_HI), x])
        r = vector_call(builder, "llvm.fma.v16f32", vf, [n, f32x16_constant(-_LN2_LO), r])
        poly = f32x16_constant(_EXP_POLY[0])
        for c in _EXP_POLY[1:]:
            poly = vector_call(builder, "llvm.fma.v16f32", vf, [poly, r, f32x16_constant(c)])
        r2 = builder.fmul(r, r)
        poly = vector_call(builder, "llvm.fma.v16f32", vf, [poly, r2, builder.fadd(r, f32x16_constant(1.0))])
        exponent = builder.add(builder.fptosi(n, vi), ir.Constant(vi, [127] * LANES))
        two_n = builder.bitcast(builder.shl(exponent, ir.Constant(vi, [23] * LANES)), vf)
        return builder.fmul(poly, two_n)

    return float32x16(float32x16), codegen


@intrinsic
def abs16(typingctx, value):
    """|value| lane by lane (llvm.fabs: the sign bit cleared)."""

    def codegen(context, builder, sig, args):
        return vector_call(builder, "llvm.fabs.v16f32", ir.VectorType(ir.FloatType(), LANES), [args[0]])

    return float32x16(float32x16), codegen


@intrinsic
def max16(typingctx, a, b):
    """The larger of a and b lane by lane (llvm.maxnum)."""

    def codegen(context, builder, sig, args):
        return vector_call(builder, "llvm.maxnum.v16f32", ir.VectorType(ir.FloatType(), LANES), list(args))

    return float32x16(float32x16, float32x16), codegen


@intrinsic
def splat16(typingctx, value):
    def codegen(context, builder, sig, args):
        return splat(builder, args[0], ir.VectorType(ir.FloatType(), LANES))

    return float32x16(types.float32), codegen


@intrinsic
def lane0(typingctx, value):
    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], ir.Constant(ir.IntType(32), 0))

    return types.float32(float32x16), codegen


@njit(inline="always")
def exp1(x):
    """exp16 of one float32: the same bits as a lane of exp16 would give."""
    return lane0(exp16(splat16(x)))


def halves_tree(builder, vector, combine):
    """Lanes combined pairwise, half against half, down to one: a fixed order, whatever the call site."""
    width = LANES
    while width > 1:
        width //= 2
        low = builder.shuffle_vector(
            vector, vector, ir.Constant(ir.VectorType(ir.IntType(32), width), list(range(width)))
        )
        high = builder.shuffle_vector(
            vector, vector, ir.Constant(ir.VectorType(ir.IntType(32), width), list(range(width, 2 * width)))
        )
        vector = combine(low, high, width)
    return builder.extract_element(vector, ir.Constant(ir.IntType(32), 0))


@intrinsic
def hsum(typingctx, value):
    """The sum of the 16 lanes: lanes i and i + 8 first, then i and i + 4, and so on."""

    def codegen(context, builder, sig, args):
        return halves_tree(builder, args[0], lambda a, b, width: builder.fadd(a, b))

    return types.float32(float32x16), codegen


@intrinsic
def hmax(typingctx, value):
    """The largest of the 16 lanes."""

    def codegen(context, builder, sig, args):
        def larger(a, b, width):
            return vector_call(builder, f"llvm.maxnum.v{width}f32", ir.VectorType(ir.FloatType(), width), [a, b])

        return halves_tree(builder, args[0], larger)

    return types.float32(float32x16), codegen


def halves_tree4(builder, vectors, combine):
    """halves_tree of four vectors at once, each lane of each pair combined with the same partner as
    halves_tree pairs it, so each result has the same bits: the four vectors' halves interleaved, so that
    one combine serves all four at every level (8 shuffles and 5 combines instead of 16 and 16). Returns the
    four results in order."""

    def picks(a, b, lanes):
        return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), len(lanes)), lanes))

    a, b, c, d = vectors
    # 16 -> 8: lanes 0-7 of x hold a[i] (+) a[i + 8], lanes 8-15 b's; y the same for c and d
    low, high = list(range(8)) + list(range(16, 24)), list(range(8, 16)) + list(range(24, 32))
    x = combine(picks(a, b, low), picks(a, b, high), 16)
    y = combine(picks(c, d, low), picks(c, d, high), 16)
    # 8 -> 4: lanes 4k..4k+3 hold vector k's i (+) i + 4
    low = [i + 8 * k for k in range(4) for i in range(4)]
    z = combine(picks(x, y, low), picks(x, y, [i + 4 for i in low]), 16)
    # 4 -> 2: lanes 2k, 2k+1 hold vector k's i (+) i + 2
    low = [i + 4 * k for k in range(4) for i in range(2)]
    w = combine(picks(z, z, low), picks(z, z, [i + 2 for i in low]), 8)
    # 2 -> 1: lane k holds vector k's 0 (+) 1
    r = combine(picks(w, w, [0, 2, 4, 6]), picks(w, w, [1, 3, 5, 7]), 4)
    return [builder.extract_element(r, ir.Constant(ir.IntType(32), k)) for k in range(4)]


def _four_floats(context, builder, sig, results):
    return context.make_tuple(builder, sig.return_type, results)


@intrinsic
def hsum4(typingctx, a, b, c, d):
    """(hsum(a), hsum(b), hsum(c), hsum(d)), the same bits, in one interleaved tree."""

    def codegen(context, builder, sig, args):
        return _four_floats(context, builder, sig, halves_tree4(builder, args, lambda x, y, width: builder.fadd(x, y)))

    return types.UniTuple(types.float32, 4)(float32x16, float32x16, float32x16, float32x16), codegen


@intrinsic
def hmax4(typingctx, a, b, c, d):
    """(hmax(a), hmax(b), hmax(c), hmax(d)) in one interleaved tree."""

    def codegen(context, builder, sig, args):
        def larger(x, y, width):
            return vector_call(builder, f"llvm.maxnum.v{width}f32", ir.VectorType(ir.FloatType(), width), [x, y])

        return _four_floats(context, builder, sig, halves_tree4(builder, args, larger))

    return types.UniTuple(types.float32, 4)(float32x16, float32x16, float32x16, float32x16), codegen


@intrinsic
def keep_lanes(typingctx, value, begin, end, fill):
    """value's lanes begin..end-1; every other lane set to fill (a float32 scalar)."""

    def codegen(context, builder, sig, args):
        vi = ir.VectorType(ir.IntType(32), LANES)
        vf = ir.VectorType(ir.FloatType(), LANES)
        lane = ir.Constant(vi, list(range(LANES)))
        lo = splat(builder, builder.trunc(args[1], ir.IntType(32)), vi)
        hi = splat(builder, builder.trunc(args[2], ir.IntType(32)), vi)
        inside = builder.and_(builder.icmp_signed(">=", lane, lo), builder.icmp_signed("<", lane, hi))
        fill = splat(builder, context.cast(builder, args[3], sig.args[3], types.float32), vf)
        return builder.select(inside, args[0], fill)

    return float32x16(float32x16, types.intp, types.intp, types.float32), codegen


@intrinsic
def prefetch_l2(typingctx, array, index):
    """Fetch the cache line of &array[index] into L2, not L1 (llvm.prefetch at locality 2: prefetcht1): every
    prefetch in the kernels streams lines read once, where prefetcht0 measured slower (superblock_kernels.py)."""

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        address = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        hint = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [address.type, i32, i32, i32]), "llvm.prefetch.p0"
        )
        builder.call(hint, [address, ir.Constant(i32, 0), ir.Constant(i32, 2), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(array, types.intp), codegen


@njit(inline="always")
def prefetch_l2_lines(array, first, stop):
    """prefetch_l2 each 64-byte line of a byte array's [first, stop), stop clipped to the array's end."""
    for i in range(first, min(stop, array.size), 64):
        prefetch_l2(array, i)


def operand16(context, builder, value, ty):
    """A float32x16 argument as is, a scalar one splat."""
    if isinstance(ty, Vec16):
        return value
    return splat(builder, context.cast(builder, value, ty, types.float32), ir.VectorType(ir.FloatType(), LANES))


@intrinsic
def fma16(typingctx, x, w, acc):
    """x * w + acc rounded once, lane by lane (llvm.fma: one vfmadd); x or w may be a float32 scalar (splat), acc a
    float32x16."""
    if not isinstance(acc, Vec16) or not (isinstance(x, Vec16) or isinstance(w, Vec16)):
        return None

    def codegen(context, builder, sig, args):
        vector_type = ir.VectorType(ir.FloatType(), LANES)
        operands = [operand16(context, builder, value, ty) for value, ty in zip(args, sig.args)]
        return vector_call(builder, "llvm.fma.v16f32", vector_type, operands)

    return float32x16(x, w, acc), codegen


@intrinsic
def as_float(typingctx, value):
    """An int32x16's bits read as float32x16 (a bitcast: no instruction)."""

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.VectorType(ir.FloatType(), LANES))

    return float32x16(int32x16), codegen
