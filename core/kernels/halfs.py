"""float16 and bfloat16 <-> float32 inside numba kernels.

numba has no float16 type on the CPU, so these are small LLVM intrinsics: the conversion is the
hardware one (F16C's vcvtph2ps / vcvtps2ph on x86, fcvt on aarch64), exact for f16 -> f32 and
round-to-nearest-even for f32 -> f16, as ggml's GGML_FP32_TO_FP16. On an x86 without F16C
(cpu.HALF_IN_HARDWARE false) LLVM would call a compiler-rt routine numba cannot link, so the same
conversions are done with integer operations there: the same bits (NaN payloads aside).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core.extending import intrinsic

from miro.core.kernels.cpu import HALF_IN_HARDWARE


def _constant(like: ir.Type, value, element: ir.Type) -> ir.Constant:
    """A scalar constant, or a vector of it shaped as `like`."""
    if isinstance(like, ir.VectorType):
        return ir.Constant(ir.VectorType(element, like.count), [value] * like.count)
    return ir.Constant(element, value)


def widen_halves(builder, bits, hardware: bool = HALF_IN_HARDWARE):
    """float16 bits (i16 or a vector of i16) as float32 values, exactly."""
    vector = isinstance(bits.type, ir.VectorType)
    f32 = ir.VectorType(ir.FloatType(), bits.type.count) if vector else ir.FloatType()
    if hardware:
        half = ir.VectorType(ir.HalfType(), bits.type.count) if vector else ir.HalfType()
        return builder.fpext(builder.bitcast(bits, half), f32)
    i32 = ir.VectorType(ir.IntType(32), bits.type.count) if vector else ir.IntType(32)

    def c(value):
        return _constant(bits.type, value, ir.IntType(32))

    h = builder.zext(bits, i32)
    sign = builder.shl(builder.and_(h, c(0x8000)), c(16))
    magnitude = builder.and_(h, c(0x7FFF))
    shifted = builder.shl(magnitude, c(13))
    normal = builder.add(shifted, c((127 - 15) << 23))  # the exponent rebiased
    special = builder.add(shifted, c((255 - 31) << 23))  # inf and NaN keep an all-ones exponent
    tiny = builder.bitcast(
        builder.fmul(builder.sitofp(magnitude, f32), _constant(bits.type, 2.0**-24, ir.FloatType())), i32
    )
    value = builder.select(builder.icmp_unsigned(">=", magnitude, c(0x7C00)), special, normal)
    value = builder.select(builder.icmp_unsigned("<", magnitude, c(0x0400)), tiny, value)  # zero and subnormals
    return builder.bitcast(builder.or_(value, sign), f32)


@intrinsic
def f16_bits_to_f32(typingctx, bits):
    """The float32 value of a float16 given by its 16 bits (uint16)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        return widen_halves(builder, args[0])

    return sig, codegen


@intrinsic
def widen_f16_hardware(typingctx, bits):
    """f16_bits_to_f32 by fpext, to test the integer form against (only where HALF_IN_HARDWARE)."""

    def codegen(context, builder, signature, args):
        return widen_halves(builder, args[0], hardware=True)

    return types.float32(types.uint16), codegen


@intrinsic
def _f16_bits_to_f32_integer(typingctx, bits):
    """f16_bits_to_f32 by integer operations, wherever this runs (to test them against the hardware's)."""

    def codegen(context, builder, signature, args):
        return widen_halves(builder, args[0], hardware=False)

    return types.float32(types.uint16), codegen


@intrinsic
def _f32_to_f16_bits_hardware(typingctx, value):
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return sig, codegen


@njit(inline="always")
def _f32_to_f16_bits_integer(value):
    """Round to nearest even with integer operations (F. Giesen's float_to_half_fast3_rtne)."""
    bits = f32_bits_to_u32(value)
    sign = np.uint32(bits >> np.uint32(16)) & np.uint32(0x8000)
    f = np.uint32(bits & np.uint32(0x7FFFFFFF))
    if f >= np.uint32((127 + 16) << 23):  # too large for a float16, inf or NaN
        out = np.uint32(0x7E00) if f > np.uint32(255 << 23) else np.uint32(0x7C00)
    elif f < np.uint32(113 << 23):  # a float16 subnormal: let the float adder round it
        denorm_magic = np.uint32(((127 - 15) + (23 - 10) + 1) << 23)
        out = np.uint32(f32_bits_to_u32(u32_bits_to_f32(f) + u32_bits_to_f32(denorm_magic)) - denorm_magic)
    else:  # rebias the exponent, round the 13 bits dropped to nearest even
        mantissa_odd = np.uint32(f >> np.uint32(13)) & np.uint32(1)
        out = np.uint32(np.uint32(f + np.uint32(0xC8000FFF) + mantissa_odd) >> np.uint32(13))
    return np.uint16(np.uint32(out | sign) & np.uint32(0xFFFF))


@intrinsic
def u32_bits_to_f32(typingctx, bits):
    """The float32 whose bits are `bits` (uint32)."""
    sig = types.float32(types.uint32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def f32_bits_to_u32(typingctx, value):
    """The bits (uint32) of a float32."""
    sig = types.uint32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


# The 16 bits (uint16) of the float16 nearest to a float32 (ties to even).
f32_to_f16_bits = _f32_to_f16_bits_hardware if HALF_IN_HARDWARE else _f32_to_f16_bits_integer


@njit(inline="always")
def round_to_f16(value):
    """`value` (float32) rounded to the nearest float16, as a float32: what ggml stores as a block scale."""
    return f16_bits_to_f32(f32_to_f16_bits(value))


@njit(inline="always")
def load_f16(raw, offset):
    """The little-endian float16 at raw[offset:offset + 2] (uint8 array), as a float32."""
    return f16_bits_to_f32(np.uint16(raw[offset]) | (np.uint16(raw[offset + 1]) << np.uint16(8)))


@njit(inline="always")
def bf16_bits_to_f32(bits):
    """The float32 value of a bfloat16 given by its 16 bits (its upper half)."""
    return u32_bits_to_f32(np.uint32(bits) << np.uint32(16))
