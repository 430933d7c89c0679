"""A bfloat16 GEMM for CPUs with AVX512_BF16 (Zen 4, Sapphire Rapids and later): twice the float32 FMA rate.

    out (T, N) = bf16(a) (T, K) @ bf16(W) (K, N), products summed in float32

vdpbf16ps multiplies 16 pairs of bfloat16 by 16 pairs and adds each pair's two products into a float32 lane,
so an instruction does the work of two float32 FMAs. The weights are rounded to bfloat16 once at load
(`pack_bf16`) and packed as the float32 GEMM packs them (gemm.py), 32-column panels, but with two steps of
k in each 32-bit word: panel p's k-pair j, column c at w[(p * K2 + j) * 32 + c], the even k in the low half.
The activations are rounded to bfloat16 (nearest, ties to even) on each call, two k to a word too.

The tile is gemm.py's: 8 rows x 32 columns of float32 sums in 16 zmm, each step of a k-pair two weight loads
and 8 broadcast words. Every output element is one chain over the k-pairs in order from zero, whatever the
row count: batch invariant. (Rows past the last full tile run zero-padded through the same tile.)
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.core.extending import intrinsic

from miro.core.kernels.cache_key import HELPERS
from miro.core.kernels.f32_gemm import park_tile_sums, tile_sums
from miro.core.kernels.simd import LANES, float32x16, int32x16, load16, splat

PANEL = 2 * LANES  # output columns per panel
ROWS = 8  # activation rows per tile
K2_BLOCK = 256  # k-pairs per pass over the row tiles: a panel's slice of weights is 32 KiB


class _BFloat(ir.Type):
    """LLVM's bfloat, which llvmlite's IR builder lacks: only its name is needed, for the intrinsic's signature."""

    def _to_string(self):
        return "bfloat"

    def __eq__(self, other):
        return isinstance(other, _BFloat)

    def __hash__(self):
        return hash("bfloat")


BF16_PAIRS = ir.VectorType(_BFloat(), 2 * LANES)  # vdpbf16ps's operand type (int8_peak.py too)


@intrinsic
def dot_bf16(typingctx, acc, pair, weights):
    """acc + (the two bfloat16 of `pair`, in every lane) . (the 16 bfloat16 pairs of `weights`): vdpbf16ps."""

    def codegen(context, builder, sig, args):
        vi = ir.VectorType(ir.IntType(32), LANES)
        vf = ir.VectorType(ir.FloatType(), LANES)
        broadcast = builder.bitcast(splat(builder, args[1], vi), BF16_PAIRS)
        dot = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vf, [vf, BF16_PAIRS, BF16_PAIRS]), "llvm.x86.avx512bf16.dpbf16ps.512"
        )
        return builder.call(dot, [args[0], broadcast, builder.bitcast(args[2], BF16_PAIRS)])

    return float32x16(float32x16, types.uint32, int32x16), codegen


@njit(cache=True, parallel=True)
def to_bf16_pairs(a, out):
    """out (T, K2) uint32 = a (T, K) float32 rounded to bfloat16 (nearest, ties to even), k pairs in a word
    (k even low); an odd K's last pair has a zero high half."""
    n, k = a.shape
    for t in prange(n):
        for j in range(out.shape[1]):
            word = np.uint32(0)
            for h in range(2):
                i = 2 * j + h
                if i < k:
                    bits = np.uint32(np.float32(a[t, i]).view(np.uint32))
                    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
                    word |= rounded << np.uint32(16 * h)
            out[t, j] = word
    return out


def pack_bf16(w: np.ndarray) -> np.ndarray:
    """(K, N) float32 -> the panels of k-pairs as uint32 (ceil(N / 32), ceil(K / 2), 32), zero-padded."""
    k_dim, n_cols = w.shape
    pairs = to_bf16_pairs(
        np.ascontiguousarray(w.T, dtype=np.float32), np.empty((n_cols, -(-k_dim // 2)), np.uint32)
    )  # (N, K2)
    n_panels = -(-n_cols // PANEL)
    padded = np.zeros((n_panels * PANEL, pairs.shape[1]), np.uint32)
    padded[:n_cols] = pairs
    return np.ascontiguousarray(padded.reshape(n_panels, PANEL, -1).transpose(0, 2, 1))


def padded_pairs(a: np.ndarray, k2: int, rows: int) -> np.ndarray:
    """a (T, K) float32 as bfloat16 pairs (to_bf16_pairs), (T rounded up to a multiple of `rows`, k2), the rows
    past T zero: a GEMM's whole tiles of rows."""
    pairs = np.zeros((-(-a.shape[0] // rows) * rows, k2), np.uint32)
    to_bf16_pairs(a, pairs[: a.shape[0]])
    return pairs


def matmul_bf16(a: np.ndarray, w: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out (T, N) = a (T, K) @ W with W packed by pack_bf16."""
    return _matmul(padded_pairs(a, w.shape[1], ROWS), w.reshape(-1), w.shape[1], out)


def _build():
    helpers = HELPERS

    @njit(cache=True, parallel=True)
    def matmul(a, w, k2_dim, out):
        """out (T, N) = a (T8, K2) bfloat16 pairs @ the panels w (flat), T8 >= T a multiple of 8."""
        helpers  # in numba's cache key: see cache_key.py
        n_rows = a.shape[0]
        n_out, n_cols = out.shape
        for p in prange((n_cols + PANEL - 1) // PANEL):
            n0 = p * PANEL
            width = min(PANEL, n_cols - n0)
            sums = np.empty((n_rows, PANEL), np.float32)
            for j0 in range(0, k2_dim, K2_BLOCK):
                j1 = min(k2_dim, j0 + K2_BLOCK)
                for m0 in range(0, n_rows, ROWS):
                    _tile(a, w, p * k2_dim * PANEL, m0, j0, j1, sums)
            for m in range(n_out):
                out[m, n0 : n0 + width] = sums[m, :width]
        return out

    return matmul


@njit(inline="always")
def _tile(a, w, start, m0, j0, j1, sums):
    """sums[m0:m0 + 8] += a[m0:m0 + 8, j0:j1] . the panel's k-pairs j0..j1 (from zero when j0 == 0)."""
    c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51, c60, c61, c70, c71 = tile_sums(sums, m0, j0 == 0)
    for j in range(j0, j1):
        w0 = load16(w, start + j * PANEL)
        w1 = load16(w, start + j * PANEL + LANES)
        c00, c01 = dot_bf16(c00, a[m0, j], w0), dot_bf16(c01, a[m0, j], w1)
        c10, c11 = dot_bf16(c10, a[m0 + 1, j], w0), dot_bf16(c11, a[m0 + 1, j], w1)
        c20, c21 = dot_bf16(c20, a[m0 + 2, j], w0), dot_bf16(c21, a[m0 + 2, j], w1)
        c30, c31 = dot_bf16(c30, a[m0 + 3, j], w0), dot_bf16(c31, a[m0 + 3, j], w1)
        c40, c41 = dot_bf16(c40, a[m0 + 4, j], w0), dot_bf16(c41, a[m0 + 4, j], w1)
        c50, c51 = dot_bf16(c50, a[m0 + 5, j], w0), dot_bf16(c51, a[m0 + 5, j], w1)
        c60, c61 = dot_bf16(c60, a[m0 + 6, j], w0), dot_bf16(c61, a[m0 + 6, j], w1)
        c70, c71 = dot_bf16(c70, a[m0 + 7, j], w0), dot_bf16(c71, a[m0 + 7, j], w1)
    park_tile_sums(sums, m0, (c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51, c60, c61, c70, c71))


_matmul = _build()
