"""float16 and bfloat16 <-> float32 inside numba kernels.

numba has no float16 type on the CPU, so these are small LLVM intrinsics: the
conversion is the hardware one (F16C's vcvtph2ps / vcvtps2ph on x86), exact for
f16 -> f32 and round-to-nearest-even for f32 -> f16, as ggml's GGML_FP32_TO_FP16.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core.extending import intrinsic


@intrinsic
def f16_bits_to_f32(typingctx, bits):
    """The float32 value of a float16 given by its 16 bits (uint16)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


@intrinsic
def f32_to_f16_bits(typingctx, value):
    """The 16 bits (uint16) of the float16 nearest to a float32 (ties to even)."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return sig, codegen


@intrinsic
def u32_bits_to_f32(typingctx, bits):
    """The float32 whose bits are `bits` (uint32)."""
    sig = types.float32(types.uint32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


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
