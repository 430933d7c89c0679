"""The AMX bfloat16 GEMM (core/kernels/amx_bf16.py): against float64 products of the same bfloat16-rounded operands,
its batch invariance, and which layers take it (fmt="bf16" where AMX runs and K fills whole tiles; MIRO_AMX=0 keeps
the vdpbf16ps kernel). Skipped where this process cannot run AMX-BF16."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from miro.core.kernels import amx_bf16
from miro.core.kernels.bf16_gemm import matmul_bf16, pack_bf16
from miro.core.layers.linear import Linear
from miro.core.loading.gguf_file import TensorInfo

needs_amx_bf16 = pytest.mark.skipif(not amx_bf16.ready(), reason="this process cannot run AMX-BF16 (amx_bf16.ready)")


def bf16(a: np.ndarray) -> np.ndarray:
    """float32 rounded to bfloat16, nearest with ties to even, as float32."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def bf16_layer(w: np.ndarray) -> Linear:
    """Linear(fmt="bf16") over an F32 tensor of w (out, in), as a model file would give it; w kept as _source."""
    tensor = TensorInfo("w", w.shape, GGMLQuantizationType.F32, np.ascontiguousarray(w).view(np.uint8).reshape(-1))
    layer = Linear(tensor, "bf16")
    layer._source = w
    return layer


@needs_amx_bf16
@pytest.mark.parametrize("rows, k, n", [(1, 32, 16), (15, 64, 40), (16, 576, 576), (33, 1536, 200), (300, 384, 1152)])
def test_amx_gemm_is_the_product_of_the_rounded_operands(rows, k, n):
    rng = np.random.default_rng(rows + k + n)
    a = rng.standard_normal((rows, k), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32)
    out = amx_bf16.matmul_amx_bf16(a, pack_bf16(w), np.empty((rows, n), np.float32))
    exact = bf16(a).astype(np.float64) @ bf16(w).astype(np.float64)
    assert np.abs(out - exact).max() <= 1e-5 * np.abs(exact).max()
    vdp = matmul_bf16(a, pack_bf16(w), np.empty((rows, n), np.float32))  # the other kernel: float32 rounding apart
    assert np.abs(out - vdp).max() <= 1e-5 * np.abs(exact).max()


@needs_amx_bf16
def test_a_row_gets_the_same_bits_whatever_else_is_in_the_call():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((70, 320), dtype=np.float32)
    packed = pack_bf16(rng.standard_normal((320, 100), dtype=np.float32))
    whole = amx_bf16.matmul_amx_bf16(a, packed, np.empty((70, 100), np.float32))
    for first, last in ((0, 1), (3, 10), (17, 50), (5, 37), (69, 70)):
        part = amx_bf16.matmul_amx_bf16(a[first:last], packed, np.empty((last - first, 100), np.float32))
        assert np.array_equal(part, whole[first:last])


@needs_amx_bf16
def test_a_bf16_layer_takes_amx_where_k_fills_whole_tiles():
    rng = np.random.default_rng(1)
    fits = bf16_layer(rng.standard_normal((48, 96), dtype=np.float32))  # 48 k-pairs: 3 tiles deep
    short = bf16_layer(rng.standard_normal((48, 40), dtype=np.float32))  # 20 k-pairs: not whole tiles
    assert fits._amx and not short._amx
    for layer, w_rows in ((fits, 96), (short, 40)):
        x = rng.standard_normal((5, w_rows), dtype=np.float32)
        w = layer._source  # the float32 matrix (out, in) the layer was built from
        exact = bf16(x).astype(np.float64) @ bf16(w).astype(np.float64).T
        assert np.abs(layer(x) - exact).max() <= 1e-5 * np.abs(exact).max()


@needs_amx_bf16
def test_miro_amx_0_keeps_the_vdpbf16ps_kernel():
    code = (
        "import numpy as np; from gguf import GGMLQuantizationType as Q; from miro.core.layers.linear import Linear; "
        "from miro.core.loading.gguf_file import TensorInfo; w = np.ones((16, 64), np.float32); "
        "print(Linear(TensorInfo('w', w.shape, Q.F32, w.view(np.uint8).reshape(-1)), 'bf16')._amx)"
    )
    for value, expected in (("0", "False"), ("1", "True")):
        env = dict(os.environ, MIRO_AMX=value)
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert done.stdout.strip() == expected


def test_auto_keeps_native_for_a_decoder_where_amx_runs():
    """bf16 on AMX ran 1.02-1.06x native end to end on the default model, its copy 310 MiB: not auto's choice."""
    from miro.core.loading.weight_format import choose_weight_format

    decoder = choose_weight_format("auto", 540 << 20, None, 2.4, "avx512-vnni", encoder=False, has_bf16=True)
    assert decoder.format == "native"
    encoder = choose_weight_format("auto", 540 << 20, None, 2.4, "avx512-vnni", encoder=True, has_bf16=True)
    assert encoder.format == "bf16"  # an encoder's bf16, AMX's kernel where it runs
