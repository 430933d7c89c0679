"""The bfloat16 GEMM on AMX (Sapphire Rapids and later Xeons): fmt="bf16" weights times activations rounded to
bfloat16, the products summed in float32 by TDPBF16PS, over bf16_gemm.py's packed panels as they are.

    out (T, N) = bf16(a) (T, K) @ bf16(W) (K, N)

One TDPBF16PS multiplies a 16 x 32 bfloat16 A tile by a 32 x 16 B tile into 16 x 16 float32 sums: 8,192 products,
as many as 256 vdpbf16ps. bf16_gemm.pack_bf16 already lays the weights out as AMX's B tiles want them: a panel
of 32 columns is K/2 rows of 32 words, each word two consecutive k of one column (the even k low), so 16 rows of
its first (last) 16 words, 128 bytes apart, are a B tile. The activations are rounded to bfloat16 pairs once per
call (bf16_gemm.padded_pairs) and padded with zero rows to a multiple of 16: an A tile is 16 rows of 16 words.

Each thread takes a run of panels. Per panel, 32 activation rows at a time: four C tiles (tmm0-3) from two A tiles
(tmm4-5) and the panel's two B tiles (tmm6-7), over every k in order, then stored once. A row's sums depend on its
own activations and the weights only, never on the other rows: batch-invariant. AMX adds the products in an order
of its own, so its bits are not the vdpbf16ps kernel's (they agree to float32 rounding, ~1e-6 relative); they are
the same on every AMX CPU. Used where `ready()`: a K that fills whole tiles (K / 2 a multiple of 16).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import get_num_threads, njit, prange

from miro.core.kernels import amx
from miro.core.kernels.amx import config_bytes, tile_dpbf16ps, tile_load, tile_load_config, tile_release
from miro.core.kernels.amx import tile_store, tile_zero
from miro.core.kernels.bf16_gemm import PANEL, padded_pairs
from miro.core.kernels.cache_key import HELPERS
from miro.core.kernels.cpu import compiled_features

ROWS = 16  # activation rows per A tile
PAIRS = 16  # k-pairs per A row (64 bytes) and per B tile
CONFIG = config_bytes()  # every tile 16 rows of 64 bytes


@functools.cache
def ready() -> bool:
    """Whether this process can run the AMX bfloat16 kernel: AMX's int8 checks (amx.ready) and AMX-BF16."""
    return amx.ready() and "amx-bf16" in compiled_features()


def fits(k2: int) -> bool:
    """Whether a layer of k2 k-pairs runs here: whole A and B tiles along k."""
    return k2 % PAIRS == 0


def matmul_amx_bf16(a: np.ndarray, w: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out (T, N) = a (T, K) float32 @ W packed by bf16_gemm.pack_bf16 (n_panels, K2, 32), K2 % 16 == 0."""
    return _matmul(padded_pairs(a, w.shape[1], ROWS), w, out, CONFIG, get_num_threads())


def _build():
    helpers = HELPERS

    @njit(cache=True, parallel=True)
    def matmul(a, w, out, config, threads):
        """out (T, N) = a (T16, K2) bfloat16 pairs @ the panels w (n_panels, K2, 32), T16 >= T a multiple of 16."""
        helpers  # in numba's cache key: see cache_key.py
        n_tok, n_cols = out.shape
        n_rows, k2 = a.shape
        n_panels = w.shape[0]
        a_stride = np.int64(k2 * 4)
        w_stride = np.int64(PANEL * 4)
        out_stride = np.int64(n_cols * 4)
        parts = max(1, min(threads, n_panels))
        for part in prange(parts):
            first, last = part * n_panels // parts, (part + 1) * n_panels // parts
            sums = np.empty((2 * ROWS, PANEL), np.float32)  # a panel's 32 rows where they do not fit `out`
            tile_load_config(config)
            for p in range(first, last):
                w_at = np.int64(p) * k2 * w_stride
                n0 = p * PANEL
                for m0 in range(0, n_rows, 2 * ROWS):
                    two = m0 + ROWS < n_rows
                    a0 = np.int64(m0) * a_stride
                    a1 = a0 + ROWS * a_stride
                    tile_zero(0)
                    tile_zero(1)
                    tile_zero(2)
                    tile_zero(3)
                    for j in range(0, k2, PAIRS):
                        tile_load(6, w, w_at + j * w_stride, w_stride)
                        tile_load(7, w, w_at + j * w_stride + 64, w_stride)
                        tile_load(4, a, a0 + j * 4, a_stride)
                        tile_dpbf16ps(0, 4, 6)
                        tile_dpbf16ps(1, 4, 7)
                        if two:
                            tile_load(5, a, a1 + j * 4, a_stride)
                            tile_dpbf16ps(2, 5, 6)
                            tile_dpbf16ps(3, 5, 7)
                    rows = min(2 * ROWS, n_tok - m0)  # at least 1: n_rows is n_tok rounded up to 16
                    if rows == 2 * ROWS and n0 + PANEL <= n_cols:  # the whole block lands in out
                        at = np.int64(m0) * out_stride + n0 * 4
                        tile_store(0, out, at, out_stride)
                        tile_store(1, out, at + 64, out_stride)
                        tile_store(2, out, at + ROWS * out_stride, out_stride)
                        tile_store(3, out, at + ROWS * out_stride + 64, out_stride)
                        continue
                    tile_store(0, sums, 0, np.int64(PANEL * 4))
                    tile_store(1, sums, 64, np.int64(PANEL * 4))
                    if two:
                        tile_store(2, sums, ROWS * PANEL * 4, np.int64(PANEL * 4))
                        tile_store(3, sums, ROWS * PANEL * 4 + 64, np.int64(PANEL * 4))
                    width = min(PANEL, n_cols - n0)
                    for m in range(rows):
                        for c in range(width):
                            out[m0 + m, n0 + c] = sums[m, c]
            tile_release()
        return out

    return matmul


_matmul = _build()
