"""simd.py's reductions and exp16: the four-at-once trees give each vector's own tree's bits; exp16's clamp."""

from __future__ import annotations

import numpy as np
from numba import njit

from miro.core.kernels.simd import _EXP_HI, exp16, hmax, hmax4, hsum, hsum4, load16, store16


@njit
def _trees(x, out):
    """out[0:4] hsum4, out[4:8] hmax4 of x's four vectors; out[8:12], out[12:16] their hsum and hmax one by one."""
    a, b, c, d = load16(x, 0), load16(x, 16), load16(x, 32), load16(x, 48)
    out[0], out[1], out[2], out[3] = hsum4(a, b, c, d)
    out[4], out[5], out[6], out[7] = hmax4(a, b, c, d)
    out[8], out[9], out[10], out[11] = hsum(a), hsum(b), hsum(c), hsum(d)
    out[12], out[13], out[14], out[15] = hmax(a), hmax(b), hmax(c), hmax(d)


@njit
def _exp_all(x, out):
    for i in range(0, x.size, 16):
        store16(out, i, exp16(load16(x, i)))


def test_four_trees_give_each_vectors_own_bits():
    """Sums whose order matters (magnitudes from 1e-8 to 1e8, both signs) and -inf lanes (masked scores)."""
    rng = np.random.default_rng(0)
    out = np.empty(16, np.float32)
    for _ in range(3000):
        x = (rng.standard_normal(64) * 10.0 ** rng.integers(-8, 9, 64)).astype(np.float32)
        x[rng.random(64) < 0.1] = -np.inf
        _trees(x, out)
        assert np.array_equal(out[0:4], out[8:12], equal_nan=True)
        assert np.array_equal(
            out[0:4].view(np.uint32)[np.isfinite(out[0:4])], out[8:12].view(np.uint32)[np.isfinite(out[8:12])]
        )
        assert np.array_equal(out[4:8], out[12:16])
    _trees(np.arange(64, dtype=np.float32), out)  # each vector's own lanes, in order
    assert out[0:4].tolist() == [sum(range(16 * k, 16 * k + 16)) for k in range(4)]
    assert out[4:8].tolist() == [15, 31, 47, 63]


def test_exp16_within_2_ulp_and_its_clamp():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-87, 88, 1 << 16), rng.standard_normal(1 << 16)]).astype(np.float32)
    out = np.empty_like(x)
    _exp_all(x, out)
    exact = np.exp(x.astype(np.float64))
    assert (np.abs(out - exact) <= 2 * np.spacing(exact.astype(np.float32))).all()
    special = np.array([np.nan, np.inf, -np.inf, 200, -200, _EXP_HI, 0.0, -0.0] * 2, dtype=np.float32)
    out = np.empty_like(special)
    _exp_all(special, out)
    top = out[5]  # e^_EXP_HI: anything above it, and NaN, clamp to it
    assert np.isfinite(top) and top > 1e38
    assert out[0] == out[1] == out[3] == top
    assert out[2] == out[4] and 0 < out[2] <= np.float32(2.0**-126)  # -inf and anything below -87.3: about 2^-126
    assert out[6] == out[7] == 1.0
