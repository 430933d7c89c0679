"""Float weights (F32, F16, BF16) times float32 activations, with the weights used as stored.

Each weight row is widened to float32 once per call into a scratch tile, then dotted with every
activation row. Every dot product runs through the one compiled loop of `_dot` (LLVM's
vectorised sum, with its fixed order for a given length), so a row's result does not depend on
how many rows the call has or where the row sits.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from numba import njit, prange

from miro.core.kernels.cache_key import HELPERS
from miro.core.kernels.halfs import bf16_bits_to_f32, f16_bits_to_f32
from miro.core.kernels.simd import LANES, hsum, load16, zeros16

F32 = int(GGMLQuantizationType.F32)
F16 = int(GGMLQuantizationType.F16)
BF16 = int(GGMLQuantizationType.BF16)

TILE_ROWS = 16  # weight rows widened together; each activation row is read once per tile


@njit(inline="always")
def _dot(a, b):
    """sum(a * b) in float32, in one order on every CPU tier: four 16-lane chains over blocks of 64 values,
    the rest of the 16s into the first, the chains added pairwise, the lanes in simd.hsum's tree, then the
    last few values one by one. (A reduction LLVM vectorises itself is ordered by the vector width.)"""
    k = a.shape[0]
    c0 = c1 = c2 = c3 = zeros16()
    for i in range(0, k - k % 64, 64):
        c0 = c0 + load16(a, i) * load16(b, i)
        c1 = c1 + load16(a, i + 16) * load16(b, i + 16)
        c2 = c2 + load16(a, i + 32) * load16(b, i + 32)
        c3 = c3 + load16(a, i + 48) * load16(b, i + 48)
    for i in range(k - k % 64, k - k % LANES, LANES):
        c0 = c0 + load16(a, i) * load16(b, i)
    total = hsum((c0 + c1) + (c2 + c3))
    for i in range(k - k % LANES, k):
        total += a[i] * b[i]
    return total


def _build_matmul_float():
    helpers = HELPERS  # made here so that the kernel closes over HELPERS (see cache_key.py)

    @njit(cache=True, parallel=True)
    def matmul_float(wtype, w, x, out):
        """out (T, N) = x (T, K) float32 times w.T, w (N, K) stored as float32, or float16 / bfloat16 bits (uint16)."""
        helpers  # in numba's cache key
        n_out, k = w.shape
        n_tok = x.shape[0]
        for tile in prange((n_out + TILE_ROWS - 1) // TILE_ROWS):
            n0 = tile * TILE_ROWS
            rows = min(TILE_ROWS, n_out - n0)
            widened = np.empty((TILE_ROWS, k), np.float32)
            for r in range(rows):
                for i in range(k):
                    if wtype == F16:
                        widened[r, i] = f16_bits_to_f32(np.uint16(w[n0 + r, i]))
                    elif wtype == BF16:
                        widened[r, i] = bf16_bits_to_f32(np.uint16(w[n0 + r, i]))
                    else:
                        widened[r, i] = w[n0 + r, i]
            for t in range(n_tok):
                x_t = x[t]
                for r in range(rows):
                    out[t, n0 + r] = _dot(widened[r], x_t)
        return out

    return matmul_float


matmul_float = _build_matmul_float()
