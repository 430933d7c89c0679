"""float16 conversions by integer operations (for x86 CPUs without F16C, cpu.HALF_IN_HARDWARE false) give the
hardware's bits: every float16, and float32 values around every rounding boundary."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from miro.core.kernels import halfs

pytestmark = pytest.mark.skipif(not halfs.HALF_IN_HARDWARE, reason="no float16 instructions to compare with")


@njit
def _widen(bits, integer):
    out = np.empty(bits.size, np.float32)
    for i in range(bits.size):
        out[i] = halfs._f16_bits_to_f32_integer(bits[i]) if integer else halfs.widen_f16_hardware(bits[i])
    return out


@njit
def _narrow(x, integer):
    out = np.empty(x.size, np.uint16)
    for i in range(x.size):
        out[i] = halfs._f32_to_f16_bits_integer(x[i]) if integer else halfs._f32_to_f16_bits_hardware(x[i])
    return out


def test_every_float16_widens_to_the_hardwares_float32():
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    hardware, integer = _widen(bits, False), _widen(bits, True)
    nan = np.isnan(hardware)
    np.testing.assert_array_equal(integer.view(np.uint32)[~nan], hardware.view(np.uint32)[~nan])
    assert np.isnan(integer[nan]).all()


def test_float32_rounds_to_the_hardwares_float16():
    rng = np.random.default_rng(0)
    f16 = np.arange(2**15, dtype=np.uint32)
    bits = np.concatenate(
        [
            rng.integers(0, 2**31, 1_000_000, dtype=np.uint64).astype(np.uint32),
            np.arange(0x33000000 - 4096, 0x47800000 + 4096, 1021, dtype=np.uint32),  # subnormal to overflow
            (f16 << 13) + 0x38000000 + 0x1000,  # halfway between two normal float16s: ties to even
            (f16 << 13) + 0x38000000 + 0x0FFF,
            (f16 << 13) + 0x38000000 + 0x1001,
            np.array([0, 0x7F800000, 0x477FE000, 0x477FF000, 0x38800000, 0x387FFFFF], np.uint32),
        ]
    )
    x = np.concatenate([bits, bits | 0x80000000]).view(np.float32)
    x = x[~np.isnan(x)]
    np.testing.assert_array_equal(_narrow(x, True), _narrow(x, False))
