"""The batch-invariant float32 GEMM: every row bitwise the same whatever else is in the call and whichever
micro-kernel shape the tier takes (8 x 32 on 512-bit tiers, 6 x 16 on the others), close to float64, the
same bits from the (K, N) layout and the packed panels."""

from __future__ import annotations

import numpy as np
import pytest

from miro.core.kernels import cpu
from miro.core.kernels.f32_gemm import matmul_invariant, pack_panels

TIERS = [pytest.param(cpu.TIERS[name], id=name) for name in cpu.runnable()]


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("k_dim, n_cols", [(576, 1536), (300, 1000), (1536, 96), (40, 7)])
def test_each_row_is_the_same_alone_and_in_any_batch(k_dim, n_cols, tier):
    rng = np.random.default_rng(k_dim)
    w = rng.standard_normal((k_dim, n_cols)).astype(np.float32)
    panels = pack_panels(w)
    row = rng.standard_normal((1, k_dim)).astype(np.float32)
    alone = matmul_invariant(row, panels, np.empty((1, n_cols), np.float32), tier)[0]
    for n_rows in (2, 3, 6, 7, 8, 9, 16, 37, 64):
        batch = rng.standard_normal((n_rows, k_dim)).astype(np.float32)
        for position in sorted({0, n_rows // 2, n_rows - 1}):
            batch[position] = row[0]
            got = matmul_invariant(batch, panels, np.empty((n_rows, n_cols), np.float32), tier)
            np.testing.assert_array_equal(got[position], alone, err_msg=f"{n_rows} rows, at {position}")
            np.testing.assert_array_equal(matmul_invariant(batch, w, np.empty((n_rows, n_cols), np.float32), tier), got)


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("k_dim, n_cols", [(600, 1000), (1100, 40), (40, 7)])
def test_every_shape_gives_the_bits_of_a_row_alone(k_dim, n_cols, tier):
    """Rows computed one by one on the best tier here (on a 512-bit machine the 8 x 32 shape), against every
    tier's batches: K past one block and not a multiple of either K block, N not a multiple of 32 (nor, for
    1000 and 7, of 16)."""
    rng = np.random.default_rng(n_cols)
    w = rng.standard_normal((k_dim, n_cols)).astype(np.float32)
    panels = pack_panels(w)
    a = rng.standard_normal((200, k_dim)).astype(np.float32)
    best = cpu.TIERS[cpu.runnable()[0]]
    alone = np.concatenate([matmul_invariant(row[None], panels, np.empty((1, n_cols), np.float32), best) for row in a])
    for n_rows in (*range(1, 21), 37, 64, 200):
        got = matmul_invariant(a[:n_rows], panels, np.empty((n_rows, n_cols), np.float32), tier)
        np.testing.assert_array_equal(got, alone[:n_rows], err_msg=f"{n_rows} rows")


@pytest.mark.parametrize("tier", TIERS)
def test_close_to_float64(tier):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((13, 700)).astype(np.float32)
    w = rng.standard_normal((700, 250)).astype(np.float32)
    got = matmul_invariant(a, pack_panels(w), np.empty((13, 250), np.float32), tier)
    exact = a.astype(np.float64) @ w.astype(np.float64)
    bound = 700 * np.finfo(np.float32).eps * (np.abs(a).astype(np.float64) @ np.abs(w).astype(np.float64))
    assert (np.abs(got - exact) <= bound).all()


def test_packed_panels_hold_the_columns_zero_padded():
    w = np.arange(3 * 40, dtype=np.float32).reshape(3, 40)
    panels = pack_panels(w)
    assert panels.shape == (2, 3, 32)
    np.testing.assert_array_equal(panels[0], w[:, :32])
    np.testing.assert_array_equal(panels[1, :, :8], w[:, 32:])
    assert not panels[1, :, 8:].any()
