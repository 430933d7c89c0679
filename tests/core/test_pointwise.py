"""The row kernels of core/layers/pointwise.py: the fused residual add and RMSNorm gives the bits of numpy's add
and the plain norm, and every kernel gives the same bits split over the thread pool (from PARALLEL_FROM values) as on
the calling thread."""

from __future__ import annotations

import numpy as np
import pytest

from miro.core.layers import pointwise
from miro.core.kernels.quantize_activations import PARALLEL_FROM


def _rows(n_rows: int, width: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n_rows, width)) * rng.uniform(0.01, 30.0, (n_rows, 1))).astype(np.float32)


@pytest.mark.parametrize("n_rows,width", [(1, 576), (64, 576), (7, 100), (PARALLEL_FROM // 2048 + 3, 2048)])
def test_add_rmsnorm_is_numpys_add_then_rmsnorm(n_rows, width):
    x, h, weight = _rows(n_rows, width, 0), _rows(n_rows, width, 1), _rows(1, width, 2)[0]
    expected_x = x + h
    expected = pointwise.rmsnorm(expected_x, weight, 1e-5, np.empty_like(x))
    out = pointwise.add_rmsnorm(x, h, weight, 1e-5, np.empty_like(x))
    assert np.array_equal(x, expected_x)
    assert np.array_equal(out, expected)


def test_add_rmsnorm_without_an_addend_is_the_norm():
    x, weight = _rows(5, 64, 3), _rows(1, 64, 4)[0]
    before = x.copy()
    out = pointwise.add_rmsnorm(x, None, weight, 1e-6, np.empty_like(x))
    assert np.array_equal(x, before)
    assert np.array_equal(out, pointwise.rmsnorm(x, weight, 1e-6, np.empty_like(x)))


def test_the_pool_gives_the_calling_threads_bits():
    x, h, weight = _rows(300, 2048, 5), _rows(300, 2048, 6), _rows(1, 2048, 7)[0]
    gate_up = _rows(300, 2 * 1000, 8)  # a width that is not a whole number of SILU_CHUNK or 16-lane runs
    norms = [pointwise._rmsnorm(x, weight, 1e-5, np.empty_like(x), parallel) for parallel in (False, True)]
    assert np.array_equal(*norms)
    added = [x.copy(), x.copy()]
    fused = [pointwise._add_rmsnorm(a, h, weight, 1e-5, np.empty_like(x), p) for a, p in zip(added, (False, True))]
    assert np.array_equal(*added) and np.array_equal(*fused)
    gates = [pointwise._silu_mul(gate_up, np.empty((300, 1000), np.float32), p) for p in (False, True)]
    assert np.array_equal(*gates)
