"""A float32 GEMM whose every output row is bitwise the same whatever else is in the call: f32 weights with
batch invariance on.

OpenBLAS's sgemm picks its blocking, and with it the order of each sum, by the shape of the call, so a row
rounds differently in a batch of 7 than alone. Here every output element is one chain of fused multiply-adds
over k = 0..K-1 from zero, whatever the row count and wherever the row sits: the BLAS micro-kernel's shape
(broadcast one activation, multiply-add it into a row of weights), with nothing reassociated.

The micro-kernel's shape is the CPU tier's (cpu.py), the bits the same in either:

    512-bit tiers  an 8-row x 32-column tile of sums in 16 zmm; each step of k loads two weight vectors and
                   broadcasts 8 activations from memory. Work items are 32-column panels. Fewer than 8 rows
                   take each row against 4 panels at once (8 chains).
    256-bit and    a 6-row x 16-column tile (BLIS's Haswell shape): 6 sums of 16 lanes in 12 ymm, one weight
    portable       vector in 2, a broadcast in 1, of AVX2's 16 registers (the 8 x 32 tile would need 32 and
                   spill). Work items are a half panel, 16 columns, for a block of rows whose activations
                   stay in L2. 1 or 2 rows take each row against 2 panels at once (4 chains, 8 ymm); from 3
                   rows the tile, zero-padded, is as fast.

K is walked in blocks (a work item's slice of weights, 32 KiB, stays in L1 or L2 across its row tiles),
the sums parked in memory between blocks (a float32 store and load change nothing, so the chain is the
same). Rows past the last full tile go through the same tile, zero-padded. Weights are best packed panel by
panel (`pack_panels`, as BLAS packs them; the same packing on every tier): a panel is then read front to
back; in the (K, N) layout its rows lie N floats apart.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from miro.core.kernels import cpu
from miro.core.kernels.cache_key import HELPERS
from miro.core.kernels.simd import LANES, fma, load16, store16, zeros16

PANEL = 2 * LANES  # output columns per packed panel, the 512-bit tiers' work item
ROWS = 8  # activation rows per micro-kernel tile
K_BLOCK = 256  # steps of k per pass over the row tiles: a panel's slice of weights is 32 KiB
STRIP = 4  # panels a row takes at once below 8 rows

NARROW_ROWS = 6  # the 256-bit shape's rows per tile
NARROW_K_BLOCK = 512  # a half panel's slice is 32 KiB too (measured: 256 slower, 576 and 1536 the same)
NARROW_STRIP = 2  # panels a row takes at once below NARROW_FEW_ROWS rows
NARROW_FEW_ROWS = 3  # from 3 rows on one zero-padded 6-row tile is as fast as 3 rows taken one by one
NARROW_ROW_BLOCK_BYTES = 256 * 1024  # activations per block of rows, to stay in L2


def pack_panels(w: np.ndarray) -> np.ndarray:
    """(K, N) float32 -> (ceil(N / 32), K, 32): each 32-column panel contiguous, the last one zero-padded."""
    k_dim, n_cols = w.shape
    n_panels = -(-n_cols // PANEL)
    padded = np.zeros((k_dim, n_panels * PANEL), np.float32)
    padded[:, :n_cols] = w
    return np.ascontiguousarray(padded.reshape(k_dim, n_panels, PANEL).transpose(1, 0, 2))


def matmul_invariant(a: np.ndarray, w: np.ndarray, out: np.ndarray, tier: cpu.Tier = cpu.TIER) -> np.ndarray:
    """out (T, N) = a (T, K) @ W, W either (K, N) or packed by pack_panels; every element of out one fused
    multiply-add chain over k in order. `tier` chooses the micro-kernel's shape, never the bits."""
    if w.ndim == 3:
        flat, stride, panel_step = w.reshape(w.size), PANEL, w.shape[1] * PANEL
    elif w.shape[1] % PANEL:
        flat, stride, panel_step = pack_panels(w).reshape(-1), PANEL, w.shape[0] * PANEL
    else:
        flat, stride, panel_step = w.reshape(w.size), w.shape[1], PANEL
    if tier.vector_bits == 512:
        tile_rows, few_below, matmul, few_rows = ROWS, ROWS, _matmul, _matmul_few_rows
    else:
        tile_rows, few_below, matmul, few_rows = NARROW_ROWS, NARROW_FEW_ROWS, _matmul_narrow, _matmul_narrow_few_rows
    if a.shape[0] < few_below:  # a few rows: a wider strip of columns per row instead of the tile
        return few_rows(a, flat, stride, panel_step, out)
    rows = -(-a.shape[0] // tile_rows) * tile_rows
    if rows != a.shape[0]:
        a = np.concatenate([a, np.zeros((rows - a.shape[0], a.shape[1]), np.float32)])
    return matmul(a, flat, stride, panel_step, out)


def _build():
    helpers = HELPERS

    @njit(cache=True, parallel=True)
    def matmul_panels(a, w, stride, panel_step, out):
        """out (T, N) = a (T8, K) @ W, T8 >= T a multiple of 8: panel p's row k at w[p * panel_step + k * stride]."""
        helpers  # in numba's cache key: see cache_key.py
        n_rows, k_dim = a.shape
        n_out, n_cols = out.shape
        for p in prange((n_cols + PANEL - 1) // PANEL):
            n0 = p * PANEL
            width = min(PANEL, n_cols - n0)
            sums = np.empty((n_rows, PANEL), np.float32)  # the sums between blocks of K
            for k0 in range(0, k_dim, K_BLOCK):
                k1 = min(k_dim, k0 + K_BLOCK)
                for m0 in range(0, n_rows, ROWS):
                    _tile(a, w, p * panel_step, stride, m0, k0, k1, sums)
            for m in range(n_out):
                out[m, n0 : n0 + width] = sums[m, :width]
        return out

    @njit(cache=True, parallel=True)
    def matmul_panels_few_rows(a, w, stride, panel_step, out):
        """The same chains for T < 8 rows, each row against 4 panels at once: 8 independent chains hide the
        fused multiply-add's latency, as the 8-row tile's 16 do."""
        helpers  # in numba's cache key: see cache_key.py
        n_rows, k_dim = a.shape
        n_cols = out.shape[1]
        n_panels = (n_cols + PANEL - 1) // PANEL
        for group in prange((n_panels + STRIP - 1) // STRIP):
            p0 = group * STRIP
            starts = np.empty(STRIP, np.int64)  # an absent panel past the end repeats the last one, unstored
            for j in range(STRIP):
                starts[j] = min(p0 + j, n_panels - 1) * panel_step
            sums = np.empty((STRIP, PANEL), np.float32)
            for m in range(n_rows):
                c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = zeros16()
                for k in range(k_dim):
                    x = a[m, k]
                    c0, c1 = (
                        fma(x, load16(w, starts[0] + k * stride), c0),
                        fma(x, load16(w, starts[0] + k * stride + LANES), c1),
                    )
                    c2, c3 = (
                        fma(x, load16(w, starts[1] + k * stride), c2),
                        fma(x, load16(w, starts[1] + k * stride + LANES), c3),
                    )
                    c4, c5 = (
                        fma(x, load16(w, starts[2] + k * stride), c4),
                        fma(x, load16(w, starts[2] + k * stride + LANES), c5),
                    )
                    c6, c7 = (
                        fma(x, load16(w, starts[3] + k * stride), c6),
                        fma(x, load16(w, starts[3] + k * stride + LANES), c7),
                    )
                (
                    store16(sums[0], 0, c0),
                    store16(sums[0], LANES, c1),
                    store16(sums[1], 0, c2),
                    store16(sums[1], LANES, c3),
                )
                (
                    store16(sums[2], 0, c4),
                    store16(sums[2], LANES, c5),
                    store16(sums[3], 0, c6),
                    store16(sums[3], LANES, c7),
                )
                for j in range(min(STRIP, n_panels - p0)):
                    n0 = (p0 + j) * PANEL
                    width = min(PANEL, n_cols - n0)
                    out[m, n0 : n0 + width] = sums[j, :width]
        return out

    return matmul_panels, matmul_panels_few_rows


@njit(inline="always")
def tile_sums(sums, m0, fresh):
    """An 8 x 32 tile's 16 vectors of sums: zeros when `fresh`, else those parked in sums[m0:m0 + 8]."""
    if fresh:
        zero = zeros16()
        return (zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero)
    return (
        load16(sums[m0], 0),
        load16(sums[m0], LANES),
        load16(sums[m0 + 1], 0),
        load16(sums[m0 + 1], LANES),
        load16(sums[m0 + 2], 0),
        load16(sums[m0 + 2], LANES),
        load16(sums[m0 + 3], 0),
        load16(sums[m0 + 3], LANES),
        load16(sums[m0 + 4], 0),
        load16(sums[m0 + 4], LANES),
        load16(sums[m0 + 5], 0),
        load16(sums[m0 + 5], LANES),
        load16(sums[m0 + 6], 0),
        load16(sums[m0 + 6], LANES),
        load16(sums[m0 + 7], 0),
        load16(sums[m0 + 7], LANES),
    )


@njit(inline="always")
def park_tile_sums(sums, m0, tile):
    """Store an 8 x 32 tile's 16 vectors of sums in sums[m0:m0 + 8] (a float32 store changes nothing)."""
    for r in range(8):
        store16(sums[m0 + r], 0, tile[2 * r])
        store16(sums[m0 + r], LANES, tile[2 * r + 1])


@njit(inline="always")
def _tile(a, w, start, stride, m0, k0, k1, sums):
    """sums[m0:m0 + 8] += a[m0:m0 + 8, k0:k1] @ the panel's rows k0..k1, one fused multiply-add at a time
    (from zero when k0 == 0)."""
    c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51, c60, c61, c70, c71 = tile_sums(sums, m0, k0 == 0)
    for k in range(k0, k1):
        w0 = load16(w, start + k * stride)
        w1 = load16(w, start + k * stride + LANES)
        c00, c01 = fma(a[m0, k], w0, c00), fma(a[m0, k], w1, c01)
        c10, c11 = fma(a[m0 + 1, k], w0, c10), fma(a[m0 + 1, k], w1, c11)
        c20, c21 = fma(a[m0 + 2, k], w0, c20), fma(a[m0 + 2, k], w1, c21)
        c30, c31 = fma(a[m0 + 3, k], w0, c30), fma(a[m0 + 3, k], w1, c31)
        c40, c41 = fma(a[m0 + 4, k], w0, c40), fma(a[m0 + 4, k], w1, c41)
        c50, c51 = fma(a[m0 + 5, k], w0, c50), fma(a[m0 + 5, k], w1, c51)
        c60, c61 = fma(a[m0 + 6, k], w0, c60), fma(a[m0 + 6, k], w1, c61)
        c70, c71 = fma(a[m0 + 7, k], w0, c70), fma(a[m0 + 7, k], w1, c71)
    park_tile_sums(sums, m0, (c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51, c60, c61, c70, c71))


def _build_narrow():
    helpers = HELPERS

    @njit(cache=True, parallel=True)
    def matmul_half_panels(a, w, stride, panel_step, out):
        """out (T, N) = a (T6, K) @ W, T6 >= T a multiple of 6, in 6 x 16 tiles. Work items are (block of rows,
        half panel), the blocks' activations small enough to stay in L2 while each thread walks the half panels
        (the 6-row tile reuses an activation half as often as the 8 x 32 one does)."""
        helpers  # in numba's cache key: see cache_key.py
        n_rows, k_dim = a.shape
        n_out, n_cols = out.shape
        n_halves = (n_cols + LANES - 1) // LANES
        block_rows, n_blocks = row_blocks(n_rows, k_dim * 4, NARROW_ROWS, NARROW_ROW_BLOCK_BYTES)
        for item in prange(n_blocks * n_halves):
            r0 = item // n_halves * block_rows
            r1 = min(n_rows, r0 + block_rows)
            h = item % n_halves
            n0 = h * LANES
            width = min(LANES, n_cols - n0)
            start = (h // 2) * panel_step + (h % 2) * LANES
            sums = np.empty((block_rows, LANES), np.float32)
            for k0 in range(0, k_dim, NARROW_K_BLOCK):
                k1 = min(k_dim, k0 + NARROW_K_BLOCK)
                for m0 in range(r0, r1, NARROW_ROWS):
                    _tile_narrow(a, w, start, stride, m0, k0, k1, sums[m0 - r0 : m0 - r0 + NARROW_ROWS])
            for m in range(r0, min(r1, n_out)):
                out[m, n0 : n0 + width] = sums[m - r0, :width]
        return out

    @njit(cache=True, parallel=True)
    def matmul_half_panels_few_rows(a, w, stride, panel_step, out):
        """The same chains for T < 3 rows, each row against 2 panels at once: 4 chains of 16 lanes, 8 ymm."""
        helpers  # in numba's cache key: see cache_key.py
        n_rows, k_dim = a.shape
        n_cols = out.shape[1]
        n_panels = (n_cols + PANEL - 1) // PANEL
        for group in prange((n_panels + NARROW_STRIP - 1) // NARROW_STRIP):
            p0 = group * NARROW_STRIP
            s0 = p0 * panel_step
            s1 = min(p0 + 1, n_panels - 1) * panel_step  # an absent panel past the end repeats the last, unstored
            sums = np.empty((NARROW_STRIP, PANEL), np.float32)
            for m in range(n_rows):
                c0 = c1 = c2 = c3 = zeros16()
                for k in range(k_dim):
                    x = a[m, k]
                    c0, c1 = fma(x, load16(w, s0 + k * stride), c0), fma(x, load16(w, s0 + k * stride + LANES), c1)
                    c2, c3 = fma(x, load16(w, s1 + k * stride), c2), fma(x, load16(w, s1 + k * stride + LANES), c3)
                (
                    store16(sums[0], 0, c0),
                    store16(sums[0], LANES, c1),
                    store16(sums[1], 0, c2),
                    store16(sums[1], LANES, c3),
                )
                for j in range(min(NARROW_STRIP, n_panels - p0)):
                    n0 = (p0 + j) * PANEL
                    width = min(PANEL, n_cols - n0)
                    out[m, n0 : n0 + width] = sums[j, :width]
        return out

    return matmul_half_panels, matmul_half_panels_few_rows


@njit(inline="always")
def row_blocks(n_rows, row_bytes, tile_rows, block_bytes):
    """(rows per block, blocks): blocks of whole tiles of `tile_rows`, as even as can be, whose activations
    (row_bytes a row) stay within block_bytes (a block of at least one tile)."""
    n_tiles = n_rows // tile_rows
    n_blocks = max(1, min(n_tiles, (n_rows * row_bytes + block_bytes - 1) // block_bytes))
    block_rows = (n_tiles + n_blocks - 1) // n_blocks * tile_rows
    return block_rows, (n_rows + block_rows - 1) // block_rows


@njit(inline="always")
def _tile_narrow(a, w, start, stride, m0, k0, k1, sums):
    """sums (6, 16) += a[m0:m0 + 6, k0:k1] @ the half panel's rows k0..k1 (16 columns from w[start]), as
    _tile does."""
    if k0 == 0:
        c0 = c1 = c2 = c3 = c4 = c5 = zeros16()
    else:
        c0, c1, c2 = load16(sums[0], 0), load16(sums[1], 0), load16(sums[2], 0)
        c3, c4, c5 = load16(sums[3], 0), load16(sums[4], 0), load16(sums[5], 0)
    for k in range(k0, k1):
        w0 = load16(w, start + k * stride)
        c0, c1, c2 = fma(a[m0, k], w0, c0), fma(a[m0 + 1, k], w0, c1), fma(a[m0 + 2, k], w0, c2)
        c3, c4, c5 = fma(a[m0 + 3, k], w0, c3), fma(a[m0 + 4, k], w0, c4), fma(a[m0 + 5, k], w0, c5)
    store16(sums[0], 0, c0), store16(sums[1], 0, c1), store16(sums[2], 0, c2)
    store16(sums[3], 0, c3), store16(sums[4], 0, c4), store16(sums[5], 0, c5)


_matmul, _matmul_few_rows = _build()
_matmul_narrow, _matmul_narrow_few_rows = _build_narrow()
