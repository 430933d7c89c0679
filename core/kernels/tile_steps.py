"""The float steps and row stores every tile kernel shares: tile_kernels.tiles_32's, and the AMX (amx_tiles.py,
amx_superblocks.py) and grouped (grouped_experts.py, grouped_superblocks.py) kernels that give its bits.

These are inlined into the cached kernels (njit(inline="always"), or read as constants when a factory makes its
kernel), so this module is one of cache_key.py's helper modules: an edit here recompiles them.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from miro.core.kernels.cpu import Tier
from miro.core.kernels.int8_dots import tile_signed_bytes
from miro.core.kernels.quant_blocks import HAS_MIN, MXFP4, Q4_0, Q4_1, Q5_1, quads_offset
from miro.core.kernels.simd import LANES, as_float, fma16, store16, to_float
from miro.core.kernels.tiles import quant_bytes


def tile_offset(qtype: int, tier: Tier) -> int:
    """What the tile's integer sum needs added, times the activations' sum, to be ggml's sum."""
    return 0 if tile_signed_bytes(qtype, tier.has_vnni) else quads_offset(qtype)


# Q4_0's float step begins with isum x d (add_block32), d a vector of the weight rows shared by every token: its
# integer sums begin at these bits, 1.5 x 2^23 as a float32, so that the sum's bits read as a float are
# 1.5 x 2^23 + isum exactly (|isum| < 2^22), and isum x d = fma(those, d, -1.5 x 2^23 x d) rounded once as
# to_float(isum) x d is (-1.5 x 2^23 x d exact: d is a float16), one instruction for to_float and the product.
FLOAT_BIAS_BITS = 0x4B400000
FLOAT_BIAS = np.float32(12582912.0)


def float_bias_bits(qtype: int) -> int:
    return FLOAT_BIAS_BITS if qtype == Q4_0 else 0


def tile_constants(qtype: int, tier: Tier) -> tuple[bool, int, int, int, bool]:
    """What a tile kernel bakes in: Q4_1's or Q5_1's mins, the sums' offset, a block's quant bytes, vpdpbusd or
    not, and whether the scales are MXFP4's E8M0 bytes (else float16)."""
    return qtype in HAS_MIN, tile_offset(qtype, tier), quant_bytes(qtype), int(tier.has_vnni), qtype == MXFP4


@njit(inline="always")
def float_step(qtype, acc, isum, dw, dw_bias, mw, d_act, s_act):
    """add_block32's float steps for 16 weight rows and one token, bit for bit, in fewer instructions: isum is the
    block's int32 sums begun at tiles_32's start (the offset's share in them already; Q4_0's read as floats are
    1.5 x 2^23 + isum, FLOAT_BIAS). Q4_0: (isum x d) x d_act, its first product one fma with dw_bias
    (-1.5 x 2^23 x d), exact as FLOAT_BIAS says. Q4_1, Q5_1: the product m x s_act of two float16 values is exact in
    float32, so (d x d_act) x isum + m x s_act is one fma rounded as the product's sum with it is."""
    if qtype == Q4_0:
        return acc + fma16(as_float(isum), dw, dw_bias) * d_act
    if qtype == Q4_1 or qtype == Q5_1:
        return acc + fma16(mw, s_act, (dw * d_act) * to_float(isum))
    return acc + (dw * d_act) * to_float(isum)


@njit(inline="always")
def store_tile_row(out, t, n0, sums, spill):
    """out[t, n0:n0 + 16] = sums, for the rows and columns out has (padding rows and a short last tile aside)."""
    if t >= out.shape[0]:
        return
    if n0 + LANES <= out.shape[1]:
        store16(out[t], n0, sums)
        return
    store16(spill, 0, sums)
    for j in range(out.shape[1] - n0):
        out[t, n0 + j] = spill[j]
