"""core/kernels/weight_types.py, the one table of weight types, walked row by row: each row's block matches gguf's,
its dequantizer gives gguf-py's bits, and it has a native kernel on every CPU tier cpu.py knows (or says, by
F32_FALLBACK, that it has none). A type added without a kernel for some tier fails here."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf import quants as gguf_quants
from gguf_factory import SUPPORTED_TYPES as FACTORY_TYPES

from miro.core.kernels.dequant import SUPPORTED_TYPES, dequantize
from miro.core.loading.gguf_file import TensorInfo
from miro.core.kernels.weight_types import NATIVE_TYPES
from miro.core.layers.linear import Linear
from miro.core.kernels import cpu
from miro.core.layers.linear import has_native_kernel
from miro.core.kernels.weight_types import (
    BLOCKS_32,
    F32_FALLBACK,
    FLOAT_TYPES,
    FLOATS,
    SUPERBLOCKS,
    WEIGHT_TYPES,
    Kernels,
)
from miro.core.loading.weights import FLOAT_TYPES as LOADER_FLOAT_TYPES

ROWS = list(WEIGHT_TYPES.values())
# the activation format each kernel family takes
FAMILY_ACTIVATIONS = {FLOATS: "f32", BLOCKS_32: "q8_0", SUPERBLOCKS: "q8_k"}


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_each_rows_block_is_gguf_s(row):
    assert row.qtype in WEIGHT_TYPES and WEIGHT_TYPES[row.qtype] is row
    assert (row.block_values, row.block_bytes) == GGML_QUANT_SIZES[row.qtype]
    assert row.is_float == (row.block_values == 1)
    assert row.activations in ("f32", "q8_0", "q8_k")


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_each_rows_dequantizer_gives_gguf_pys_bits(row):
    """Random bytes, every bit pattern (NaN and infinite scales too): the same float32 bits as gguf-py's."""
    rng = np.random.default_rng(int(row.qtype))
    n_blocks = 4096 // row.block_values * 8
    raw = rng.integers(0, 256, n_blocks * row.block_bytes, dtype=np.uint8)
    shape = (8, n_blocks * row.block_values // 8)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and infinite scales: the same warnings either way
        expected = np.asarray(gguf_quants.dequantize(raw, row.qtype), dtype=np.float32).reshape(-1)
        got = np.asarray(row.dequantize(raw), dtype=np.float32).reshape(-1)
        tensor = dequantize(TensorInfo("t", shape, row.qtype, raw))
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
    assert tensor.shape == shape and tensor.dtype == np.float32 and tensor.flags.c_contiguous
    np.testing.assert_array_equal(tensor.reshape(-1).view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_each_type_has_a_native_kernel_on_every_tier_or_says_it_falls_back_to_f32(row):
    """Every tier cpu.TIERS names, whether or not this CPU runs it: the plan, and the kernels it names exist (the
    factories make numba dispatchers; nothing is compiled here)."""
    if row.kernels is F32_FALLBACK:  # documented: no native kernel anywhere, the loader keeps it as f32
        assert not has_native_kernel(row.qtype) and int(row.qtype) not in NATIVE_TYPES
        return
    assert has_native_kernel(row.qtype) and int(row.qtype) in NATIVE_TYPES
    assert FAMILY_ACTIVATIONS[row.kernels] == row.activations
    for name, tier in cpu.TIERS.items():
        plan = row.plan(tier)  # a ValueError where a tiled type has no shape for the tier's vectors
        kernels = Kernels(row, tier)
        assert kernels.rows is not None, name
        if plan.layout == "tiles":
            assert tier.int8_dot and plan.tile_tokens >= 2 and row.kernels.repack is not None, name
            assert kernels.tiles is not None, name
        else:
            assert plan.layout == "rows" and plan.lanes_from >= 1, name
            assert row.is_float or kernels.lanes is not None, name
        if tier.int8_dot and not row.is_float:  # quantized types are tiled wherever a tier has int8 dots
            assert plan.layout == "tiles", f"{row.name} has no tile kernel on the {name} tier"


def test_the_lists_the_loaders_and_linear_ask_are_the_tables():
    assert SUPPORTED_TYPES == tuple(WEIGHT_TYPES)
    assert FLOAT_TYPES == LOADER_FLOAT_TYPES == tuple(t for t, row in WEIGHT_TYPES.items() if row.is_float)
    assert set(NATIVE_TYPES) == {int(t) for t, row in WEIGHT_TYPES.items() if row.native}
    # the tests' GGUF writer writes a file of every type miro supports (a new type needs its block writer there)
    assert set(FACTORY_TYPES) == {row.name for row in ROWS}


def test_a_type_missing_from_the_table_has_no_native_layer():
    raw = np.zeros(GGML_QUANT_SIZES[Q.Q2_K][1], np.uint8)
    tensor = TensorInfo("q2k", (1, 256), Q.Q2_K, raw)
    assert not has_native_kernel(Q.Q2_K)
    with pytest.raises(ValueError, match="has no native kernel"):
        Linear(tensor)
    assert dequantize(tensor).shape == (1, 256)  # gguf-py's dequantizer, as before the table


def test_a_row_without_a_tile_shape_for_a_tiers_vectors_is_refused():
    """What the walk above catches: a tiled type whose row lacks a tier's vector width."""
    row = dataclasses.replace(WEIGHT_TYPES[Q.Q4_0], tile_tokens={512: 8})
    assert row.plan(cpu.TIERS["avx512-vnni"]).tile_tokens == 8
    with pytest.raises(ValueError, match="Q4_0 has no tile kernel shape for the avx2 tier's 256-bit vectors"):
        row.plan(cpu.TIERS["avx2"])
    assert row.plan(cpu.TIERS["portable"]).layout == "rows"
