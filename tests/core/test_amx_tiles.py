"""core/kernels/amx_tiles.py and amx_superblocks.py: where AMX runs, their products of Q4_0, Q4_1 and Q8_0 tiles,
and of Q4_K, Q5_K and Q6_K tiles, bit for bit the VNNI tile kernels' (and the K-quants' the portable kernel's), at
row counts of one and several A tiles, a short last weight tile, and activations large enough that their Q8_1 sums
overflow float16; a layer of these types takes AMX for the rows in whole A tiles and the VNNI kernel for the
rest, and the VNNI kernel alone below its type's `amx_from` rows."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from miro.core.kernels import amx, amx_kernels, amx_superblocks, amx_tiles, cpu
from miro.core.kernels.quantize_activations import quantize_q8_32, quantize_q8_k
from miro.core.kernels.weight_types import WEIGHT_TYPES
from miro.core.layers.linear import Linear
from quant_reference import activations, random_tensor

VNNI = cpu.TIERS["avx512-vnni"]
needs_amx = pytest.mark.skipif(
    not amx_tiles.usable(int(Q.Q4_1), VNNI) or amx.unusable_reason() is not None,
    reason=f"AMX int8 is not usable here: {amx.unusable_reason() or 'MIRO_AMX=0'}",
)


def _by_type(qtypes):
    """Q4_1 (the default model's type) and Q4_K (the K-quants') in the default run; each other type compiles its
    AMX kernel (and its VNNI and portable ones) from a cold numba cache, so it is slow."""
    return [pytest.param(t, id=t.name, marks=() if t in (Q.Q4_1, Q.Q4_K) else pytest.mark.slow) for t in qtypes]


@needs_amx
@pytest.mark.parametrize("qtype", _by_type([Q.Q4_0, Q.Q4_1, Q.Q8_0]))
@pytest.mark.parametrize(("n_rows", "k"), [(16, 192), (48, 192), (160, 8192)])
def test_amx_gives_the_vnni_tile_kernels_bits(qtype, n_rows, k):
    """160 rows of 8192 values: two blocks of tokens (amx_tiles.A_BYTES)."""
    layer = Linear(random_tensor(qtype, 40, k, seed=n_rows), tier="avx512-vnni")  # 3 tiles, the last of 8 rows
    x = activations(n_rows, k, seed=int(qtype))
    x[n_rows // 2] *= 4000  # Q8_1 sums past float16's largest: inf in s
    a, tiles = quantize_q8_32(x), layer._tiles
    vnni = WEIGHT_TYPES[qtype].kernels_on(VNNI).tiles
    expected = vnni(tiles.quants, tiles.scales, tiles.mins, a.q, a.d, a.s, a.qsum, np.empty((n_rows, 40), np.float32))
    got = amx_tiles.matmul(amx_kernels.kernel(int(qtype), VNNI.name), tiles, a, np.empty((n_rows, 40), np.float32))
    assert amx_tiles.usable(int(qtype), VNNI)  # layers take it, Q4_1 from 16 rows, Q4_0 and Q8_0 from 32
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


@needs_amx
def test_the_layer_takes_amx_for_whole_a_tiles_and_the_vnni_kernel_for_the_rest():
    tensor = random_tensor(Q.Q4_1, 40, 192)
    layer, portable = Linear(tensor, tier="avx512-vnni"), Linear(tensor, tier="portable")
    assert layer._amx_tiles is not None
    x = activations(37, 192)  # 32 rows on AMX, 5 on the VNNI kernel
    np.testing.assert_array_equal(layer(x).view(np.uint32), portable(x).view(np.uint32))


K_QUANTS = [Q.Q4_K, Q.Q5_K, Q.Q6_K]


@needs_amx
@pytest.mark.parametrize("qtype", _by_type(K_QUANTS))
@pytest.mark.parametrize(
    ("n_rows", "k", "n"), [(16, 512, 40), (32, 768, 48), (48, 256, 16), (272, 512, 32), (144, 8192, 16)]
)
def test_amx_gives_the_k_quant_tile_kernels_bits(qtype, n_rows, k, n):
    """Random bytes: every sub-block scale (Q4_K's, Q5_K's 6-bit ones up to 63, Q6_K's int8 ones from -128) and
    value; 272 rows of 512 and 144 of 8192 values: more than one block of activation rows (TOKEN_BLOCK, BLOCK_BYTES)."""
    tensor = random_tensor(qtype, n, k, seed=n_rows)
    layer = Linear(tensor, tier="avx512-vnni")
    x = activations(n_rows, k, seed=int(qtype))
    a, tiles = quantize_q8_k(x), layer._tiles
    vnni = WEIGHT_TYPES[qtype].kernels_on(VNNI).tiles
    out = np.empty((n_rows, n), np.float32)
    expected = vnni(tiles.quants, tiles.scales, tiles.mins, tiles.sub_scales, a.q, a.d, a.sum32, out)
    got = amx_superblocks.matmul(amx_kernels.kernel(int(qtype), VNNI.name), tiles, a, np.empty((n_rows, n), np.float32))
    assert amx_tiles.usable(int(qtype), VNNI)
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
    portable = Linear(tensor, tier="portable")(x)
    np.testing.assert_array_equal(got.view(np.uint32), portable.view(np.uint32))


@needs_amx
def test_amx_mins_are_exact_at_the_largest_sub_block_sums():
    """The mins' TDPBF16PS takes each 32-value sum as two bfloat16 parts: at the extremes (every value of a
    sub-block +127 or -127, |sum| 4,064, next to sums of one value less) the product is still the VNNI
    kernel's integer, bit for bit."""
    n_rows, k, n = 32, 512, 32
    tensor = random_tensor(Q.Q4_K, n, k, seed=7)
    layer = Linear(tensor, tier="avx512-vnni")
    signs = np.where(np.arange(k // 32) % 3 == 0, 1.0, -1.0).astype(np.float32)  # per sub-block
    x = np.repeat(signs, 32)[None, :] * np.ones((n_rows, 1), np.float32)
    x[1::2] *= -1
    x[2::4, 5] = 0.5  # one value of a sub-block less: sums just inside the extremes
    a, tiles = quantize_q8_k(x), layer._tiles
    assert {int(a.sum32.max()), int(a.sum32.min())} == {127 * 32, -127 * 32}
    vnni = WEIGHT_TYPES[Q.Q4_K].kernels_on(VNNI).tiles
    out = np.empty((n_rows, n), np.float32)
    expected = vnni(tiles.quants, tiles.scales, tiles.mins, tiles.sub_scales, a.q, a.d, a.sum32, out)
    kernel = amx_kernels.kernel(int(Q.Q4_K), VNNI.name)
    got = amx_superblocks.matmul(kernel, tiles, a, np.empty((n_rows, n), np.float32))
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


ON_AMX = [qtype for qtype in [Q.Q4_0, Q.Q4_1, Q.Q8_0, *K_QUANTS] if WEIGHT_TYPES[qtype].amx_from]


@needs_amx
@pytest.mark.parametrize("qtype", _by_type(ON_AMX))
@pytest.mark.parametrize("n_rows", [17, 45])
def test_a_layer_takes_amx_for_whole_a_tiles_from_its_amx_from_rows_and_the_vnni_kernel_for_the_rest(qtype, n_rows):
    tensor = random_tensor(qtype, 40, 512)
    layer, portable = Linear(tensor, tier="avx512-vnni"), Linear(tensor, tier="portable")
    assert layer._amx_tiles is not None
    # 17: 16 rows on AMX from 16 rows, else all on the VNNI kernel; 45: 32 rows on AMX, 13 on it
    assert layer._amx_rows(n_rows) == (0 if n_rows < WEIGHT_TYPES[qtype].amx_from else n_rows - n_rows % 16)
    x = activations(n_rows, 512)
    np.testing.assert_array_equal(layer(x).view(np.uint32), portable(x).view(np.uint32))


@pytest.mark.parametrize("qtype", ON_AMX, ids=lambda t: t.name)
def test_miro_amx_0_keeps_the_vnni_kernel(qtype):
    code = (
        "from gguf import GGMLQuantizationType as Q; from miro.core.kernels import amx_tiles, cpu; "
        f"print(amx_tiles.usable(int(Q.{qtype.name}), cpu.TIERS['avx512-vnni']))"
    )
    env = {**os.environ, "MIRO_AMX": "0"}
    line = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert line.strip() == "False"
