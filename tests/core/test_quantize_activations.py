"""The activation quantizers (core/kernels/quantize_activations.py) against a plain numpy transcription of ggml's
quantize_row_q8_0_ref / _q8_1_ref / _q8_K_ref, bit for bit, on the inputs where rounding and picking are delicate:
exact ties after scaling, zero blocks and rows, blocks whose largest magnitude is negative or occurs with both
signs, huge and tiny magnitudes; in every layout, on the serial and the parallel path, one row never depending on
another."""

from __future__ import annotations

import numpy as np
import pytest

from miro.core.kernels import quantize_activations as qa

F32 = np.float32


# ---------------------------------------------------------------- ggml's reference, in numpy


def ref_q8_32(x: np.ndarray):
    """quantize_row_q8_0_ref with q8_1's s: q (T, K) int8, d, s (T, K / 32) float32 (float16 values), qsum."""
    blocks = x.reshape(x.shape[0], -1, 32)
    d = np.abs(blocks).max(axis=2) / F32(127)  # float32 / float32: float32, as `amax / ((1 << 7) - 1)`
    inv = np.where(d != 0, F32(1) / np.where(d != 0, d, F32(1)), F32(0)).astype(F32)
    scaled = (blocks * inv[..., None]).astype(np.float64)  # the float32 product, exactly
    q = (np.sign(scaled) * np.floor(np.abs(scaled) + 0.5)).astype(np.int64)  # roundf: halves away from zero
    qsum = q.sum(axis=2)
    with np.errstate(over="ignore"):  # past float16's range: inf, as GGML_FP32_TO_FP16 gives
        s = (qsum.astype(F32) * d).astype(np.float16).astype(F32)
        return q.reshape(x.shape).astype(np.int8), d.astype(np.float16).astype(F32), s, qsum


def ref_q8_k(x: np.ndarray):
    """quantize_row_q8_K_ref: q (T, K) int8, d (T, K / 256), sum32 (T, K / 32): ggml's bsums two by two."""
    blocks = x.reshape(x.shape[0], -1, 256)
    first_max = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=2)[..., None], axis=2)[..., 0]
    iscale = (F32(-127) / np.where(first_max != 0, first_max, F32(1))).astype(F32)
    q = np.minimum(127, np.rint(blocks * iscale[..., None])).astype(np.int64)  # nearest_int: halves to even
    q[first_max == 0] = 0
    d = np.where(first_max != 0, F32(1) / iscale, F32(0)).astype(F32)
    return q.reshape(x.shape).astype(np.int8), d, q.reshape(x.shape[0], -1, 32).sum(axis=2)


# ---------------------------------------------------------------- inputs


def _rows(rng, t: int, k: int) -> np.ndarray:
    """Rows of every kind the quantizers must get right, cycled over t rows of k values (k a multiple of 256)."""
    e = F32(2.0) ** rng.integers(-12, 12, (t, 1)).astype(F32)
    halves = (rng.integers(-126, 126, (t, k)) + F32(0.5)).astype(F32)
    ties_32 = halves.copy()  # Q8_0: each block's max 127 * 2^e, so that x / d lands exactly on n + 0.5
    ties_32[:, ::32] = 127
    ties_k = halves.copy()  # Q8_K: each block's first largest magnitude -127 * 2^e: iscale = 2^-e, ties again
    ties_k[:, 3::256] = -127
    both_signs = halves.copy()  # +127 and -127 in one block: the first one decides the sign of iscale
    both_signs[:, 9::256], both_signs[:, 200::256] = 127, -127
    both_signs[1::2, 9::256], both_signs[1::2, 200::256] = -127, 127
    zeros = rng.standard_normal((t, k)).astype(F32)
    zeros[:, :256] = 0  # a zero Q8_K block and its eight zero Q8_0 blocks
    zeros[:, 288:320] = -0.0
    zeros[::3] = 0
    magnitudes = rng.standard_normal((t, k)) * 10.0 ** rng.integers(-30, 30, (t, k // 32)).repeat(32, axis=1)
    kinds = [
        rng.standard_normal((t, k)).astype(F32),
        ties_32 * e,
        ties_k * e,
        both_signs,
        zeros,
        -np.abs(rng.standard_normal((t, k))).astype(F32),  # every block's largest magnitude negative
        np.abs(rng.standard_normal((t, k))).astype(F32) * F32(3e37),  # near float32's largest
        rng.integers(-2, 3, (t, k)).astype(F32),  # many equal magnitudes
        magnitudes.astype(F32),  # blocks from 1e-30 to 1e30
    ]
    return np.stack([kinds[r % len(kinds)][r] for r in range(t)])


def _assert_bits(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_array_equal(np.ascontiguousarray(got).view(np.uint8), np.ascontiguousarray(want).view(np.uint8))


# ---------------------------------------------------------------- the quantizers


@pytest.mark.parametrize("t", [1, 9, 1024], ids=lambda t: f"T{t}")  # 1024 x 1024 values: the parallel path
def test_quantizers_match_ggml_reference_bitwise(t):
    x = _rows(np.random.default_rng(t), t, 1024)
    assert (t * x.shape[1] >= qa.PARALLEL_FROM) == (t == 1024)
    q, d, s, qsum = ref_q8_32(x)
    got = qa.quantize_q8_32(x)
    _assert_bits(got.q, q)
    _assert_bits(got.d, d)
    _assert_bits(got.s, s)
    np.testing.assert_array_equal(got.qsum, qsum)
    columns = qa.quantize_q8_32_columns(x, t + 7)
    np.testing.assert_array_equal(columns.q[:, :t].T, q)
    _assert_bits(columns.d[:, :t].T, d)
    _assert_bits(columns.s[:, :t].T, s)
    np.testing.assert_array_equal(columns.qsum[:, :t].T, qsum)

    qk, dk, sum32 = ref_q8_k(x)
    for got_k in (qa.quantize_q8_k(x), qa.quantize_q8_k_quads(x)):
        _assert_bits(got_k.d, dk)
        np.testing.assert_array_equal(got_k.sum32, sum32)
    np.testing.assert_array_equal(qa.quantize_q8_k(x).q, qk)
    quads = qa.quantize_q8_k_quads(x).q.reshape(t, 4, 4, 2, 8, 2, 2)  # value 64 c + 32 a + 16 h + 8 b + l
    np.testing.assert_array_equal(quads.transpose(0, 1, 2, 5, 3, 6, 4).reshape(t, 1024), qk)  # at 32 (2c+h)+4l+2a+b
    columns_k = qa.quantize_q8_k_columns(x, t + 7)
    np.testing.assert_array_equal(columns_k.q[:, :t].T, qk)
    _assert_bits(columns_k.d[:, :t].T, dk)
    np.testing.assert_array_equal(columns_k.sum32[:, :t].T, sum32)


def test_rows_past_t_are_zero_and_rows_independent():
    x = _rows(np.random.default_rng(5), 40, 512)
    alone = [qa.quantize_q8_32(x[r : r + 1]) for r in (0, 17, 39)]
    padded = qa.quantize_q8_32(x, 48)
    quads = qa.quantize_q8_k_quads(x, 48)
    for part in (padded.q, padded.d, padded.s, padded.qsum, quads.q, quads.d, quads.sum32):
        assert not part[40:].any()
    for r, one in zip((0, 17, 39), alone):  # a row's blocks are the same whatever rows it is quantized with
        np.testing.assert_array_equal(padded.q[r], one.q[0])
        _assert_bits(padded.d[r], one.d[0])
        _assert_bits(padded.s[r], one.s[0])
        np.testing.assert_array_equal(quads.q[r], qa.quantize_q8_k_quads(x[r : r + 1]).q[0])


def test_serial_and_parallel_paths_agree():
    x = _rows(np.random.default_rng(6), 64, 1024)
    for kernel, quantize in ((qa._rows_q8_32, qa.quantize_q8_32), (qa._rows_q8_k_quads, qa.quantize_q8_k_quads)):
        want = quantize(x)
        for parallel in (False, True):
            parts = [np.empty_like(part) for part in vars(want).values()]
            kernel(x, *parts, parallel)
            for got, expected in zip(parts, vars(want).values()):
                _assert_bits(got, expected)


def test_blocks_too_small_to_invert_stay_in_range():
    """A block whose largest magnitude is below 3.7e-37: 1 / d (Q8_0) and iscale (Q8_K) overflow, where ggml's
    reference converts inf or NaN to int8 (undefined). Here d is 0 and every q within +-127."""
    x = (np.random.default_rng(7).standard_normal((3, 512)) * 1e-38).astype(F32)
    x[1, :40] = 0
    x[2] = 1e-42
    for got in (qa.quantize_q8_32(x), qa.quantize_q8_k(x), qa.quantize_q8_k_quads(x)):
        assert np.abs(got.q.astype(np.int32)).max() <= 127
        assert not got.d.any()
    assert not qa.quantize_q8_32(x).s.any()
