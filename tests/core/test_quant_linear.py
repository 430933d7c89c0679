"""miro.core.layers.linear.Linear with weights kept as GGUF blocks: llama.cpp's scheme, accuracy, batch invariance.

The reference is quant_reference.py's plain numpy transcription of ggml's reference code: the activation
quantizers (quantize_row_q8_0_ref / _q8_1_ref / _q8_K_ref) and the generic vec_dot functions
(integer sums per block, float32 accumulation in ggml's order).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q
from gguf import quants as gguf_quants

from miro.core.kernels.dequant import dequantize
from miro.core.loading.gguf_file import GGUFFile, TensorInfo
from miro.core.layers.linear import Linear
from miro.core.kernels import cpu
from miro.core.kernels.quantize_activations import (
    quantize_q8_32,
    quantize_q8_32_columns,
    quantize_q8_k,
    quantize_q8_k_columns,
    quantize_q8_k_quads,
)
from miro.core.kernels.superblock_tiles import natural_order
from miro.core.kernels.weight_types import WEIGHT_TYPES
from quant_reference import (
    BLOCK32,
    F32,
    FLOAT_TYPES,
    QUANT_TYPES,
    SUPERBLOCK,
    activation_error_bound,
    activations,
    f16_bytes,
    random_tensor,
    ref_dequantize,
    ref_native,
    ref_quantize_q8_32,
    ref_quantize_q8_k,
)

# ---------------------------------------------------------------- the reference itself


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_reference_decoder_matches_gguf_dequantize(qtype):
    tensor = random_tensor(qtype, 8, 512)
    expected = gguf_quants.dequantize(tensor.data.reshape(8, -1), qtype).astype(np.float64)
    np.testing.assert_allclose(ref_dequantize(tensor), expected, rtol=1e-6, atol=1e-7)


def test_activation_quantizers_match_ggml_reference_bitwise():
    x = activations(37, 1024)
    x[3, :256] = 0  # an all-zero block in each format
    x[5, 64:96] = 0
    got, got_k = quantize_q8_32(x), quantize_q8_k(x)
    q, d, s = ref_quantize_q8_32(x)
    np.testing.assert_array_equal(got.q.reshape(q.shape), q)
    np.testing.assert_array_equal(got.d, d)
    np.testing.assert_array_equal(got.s, s)
    np.testing.assert_array_equal(got.qsum, q.sum(axis=2))
    qk, dk = ref_quantize_q8_k(x)
    np.testing.assert_array_equal(got_k.q.reshape(qk.shape), qk)
    np.testing.assert_array_equal(got_k.d, dk)
    np.testing.assert_array_equal(got_k.sum32, qk.reshape(37, -1, 32).sum(axis=2))
    columns = quantize_q8_32_columns(x, 64)  # the layouts the lane kernels read
    np.testing.assert_array_equal(columns.q[:, :37].T, got.q)
    np.testing.assert_array_equal(columns.d[:, :37].T, d)
    np.testing.assert_array_equal(columns.s[:, :37].T, s)
    np.testing.assert_array_equal(columns.qsum[:, :37].T, q.sum(axis=2))
    assert not columns.d[:, 37:].any() and not columns.qsum[:, 37:].any()
    columns_k = quantize_q8_k_columns(x, 64)
    np.testing.assert_array_equal(columns_k.q[:, :37].T, got_k.q)
    np.testing.assert_array_equal(columns_k.d[:, :37].T, dk)
    np.testing.assert_array_equal(columns_k.sum32[:, :37].T, got_k.sum32)
    quads = quantize_q8_k_quads(x, 40)  # the K-quant tiles' order: value 64 c + 16 h + 32 a + 8 b + l at
    by_value = quads.q.reshape(40, 4, 4, 2, 8, 2, 2)  # 256 sb + 32 (2 c + h) + 4 l + 2 a + b: [sb, c, h, l, a, b]
    by_value = by_value.transpose(0, 1, 2, 5, 3, 6, 4).reshape(40, 1024)  # [sb, c, a, h, b, l]
    np.testing.assert_array_equal(by_value[:37], got_k.q)
    np.testing.assert_array_equal(quads.d[:37], dk)
    np.testing.assert_array_equal(quads.sum32[:37], got_k.sum32)
    assert not quads.q[37:].any() and not quads.d[37:].any() and not quads.sum32[37:].any()


# ---------------------------------------------------------------- native kernels against the reference


def _tier_param(name: str):
    """This machine's own tier and the portable one in the default run; the other tiers it can execute are slow
    (numba compiles each tier's kernels anew; test_every_tiers_kernels_agree_bitwise still compares them all)."""
    return pytest.param(name, marks=() if name in (cpu.TIER.name, "portable") else pytest.mark.slow)


@pytest.fixture(params=[_tier_param(name) for name in cpu.runnable()])
def tier(request) -> str:
    """Every CPU tier this machine can execute (cpu.py), each with its own kernels and layouts."""
    return request.param


def _assert_tracks_reference(tensor: TensorInfo, x: np.ndarray, tier: str | None = None) -> None:
    got = Linear(tensor, tier=tier)(x)
    # the same integer sums and the same float32 steps in the same order: the same bits
    np.testing.assert_array_equal(got, ref_native(tensor, x))
    exact = ref_dequantize(tensor) @ x.astype(np.float64).T
    err = np.abs(got.astype(np.float64) - exact.T)
    assert (err <= activation_error_bound(tensor, x)).all(), f"max error {err.max():.3g}"


# on the portable tier row by row below its row's plan(tier).lanes_from, lanes from there; on tiers with
# int8 dots every type in tiles, 2 rows a pass below the tier's tile_tokens (the K-quants' 8 and 4 first on
# 256-bit tiers: 15 rows take 8, 4, 2, 1 there), that many from there
@pytest.mark.parametrize("n_tokens", [1, 3, 15, 37])
@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_native_tracks_llama_cpp_scheme(qtype, n_tokens, tier):
    tensor = random_tensor(qtype, 72, 512, seed=int(qtype))
    _assert_tracks_reference(tensor, activations(n_tokens, 512), tier)


@pytest.mark.parametrize("qtype", BLOCK32, ids=lambda t: t.name)
def test_native_on_random_blocks(qtype, tier):
    """Every bit pattern of the quants (not only what a quantizer writes), with finite float16 scales."""
    rng = np.random.default_rng(7)
    block_bytes = GGML_QUANT_SIZES[qtype][1]
    blocks = rng.integers(0, 256, (40 * 256 // 32, block_bytes), dtype=np.uint8)
    if qtype == Q.MXFP4:  # scales 2^-18 to 2^-1, and the denormals 2^-128, 2^-127 in a few blocks
        blocks[:, 0] = rng.integers(110, 128, len(blocks))
        blocks[::37, 0] = 0
        blocks[1::37, 0] = 1
    else:
        blocks[:, 0:2] = f16_bytes(rng.uniform(-2e-3, 2e-3, len(blocks)))
    if qtype in (Q.Q4_1, Q.Q5_1):
        blocks[:, 2:4] = f16_bytes(rng.uniform(-2e-2, 2e-2, len(blocks)))
    tensor = TensorInfo("random_blocks", (40, 256), qtype, blocks.reshape(-1))
    for n_tokens in (3, 19):
        _assert_tracks_reference(tensor, activations(n_tokens, 256, seed=n_tokens), tier)


@pytest.mark.parametrize("qtype", SUPERBLOCK, ids=lambda t: t.name)
def test_k_quant_tiles_at_the_extremes(qtype, tier):
    """Every quant and sub-block scale at its largest (and Q6_K's at -128 and 0 too), activations all +-127:
    the int16 sums of the tile kernels' vpmaddubsw must not saturate, so they still give the portable bits."""
    block_bytes = GGML_QUANT_SIZES[qtype][1]
    blocks = np.full((32 * 1024 // 256, block_bytes), 0xFF, np.uint8)
    if qtype == Q.Q6_K:
        blocks[::2, 192:208] = 0x80  # int8 scales -128 in every other block
        blocks[::3, :192] = 0  # and quants 0 (q - 32 = -32) in every third
        blocks[:, 208:210] = f16_bytes(np.full(len(blocks), 1e-3))
    else:
        blocks[:, 0:4] = f16_bytes(np.full(2 * len(blocks), 1e-3)).reshape(len(blocks), 4)
    tensor = TensorInfo("extremes", (32, 1024), qtype, blocks.reshape(-1))
    x = np.where(np.arange(1024) % 3 == 0, -1.0, 1.0).astype(F32)[None].repeat(9, axis=0)
    x[1] = 1.0  # every activation +127
    x[2] = -1.0  # every activation -127
    layer, portable = Linear(tensor, tier=tier), Linear(tensor, tier="portable")
    np.testing.assert_array_equal(layer(x), portable(x))
    for row in (1, 2):  # alone: a pass of one row (Q6_K's by q6_k_row.py on vpmaddubsw tiers, its values unsigned)
        np.testing.assert_array_equal(layer(x[row : row + 1]), portable(x[row : row + 1]))


@pytest.mark.parametrize("qtype", FLOAT_TYPES, ids=lambda t: t.name)
def test_native_float_types(qtype):
    tensor = random_tensor(qtype, 40, 300)
    x = activations(9, 300)
    exact = dequantize(tensor).astype(np.float64) @ x.astype(np.float64).T
    got = Linear(tensor)(x)
    bound = 1e-5 * (np.abs(dequantize(tensor)).astype(np.float64) @ np.abs(x.astype(np.float64)).T)
    assert (np.abs(got - exact.T) <= bound.T).all()
    np.testing.assert_array_equal(Linear(tensor)(x[4:5]), got[4:5])


# ---------------------------------------------------------------- the real default model


@pytest.fixture(scope="module")
def smollm2(smollm2_path) -> GGUFFile:
    return GGUFFile(smollm2_path)


def test_real_model_tensors(smollm2):
    names = ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.3.ffn_gate.weight", "blk.7.ffn_down.weight"]
    by_type = {}
    for name in names:
        by_type.setdefault(smollm2.tensors[name].type, []).append(name)
    assert Q.Q4_1 in by_type
    x = activations(11, 576, seed=3)
    for name in names:
        tensor = smollm2.tensors[name]
        xx = x if tensor.shape[1] == 576 else activations(11, tensor.shape[1], seed=4)
        _assert_tracks_reference(tensor, xx[:2])  # row by row
        _assert_tracks_reference(tensor, xx)  # lanes
    embd = smollm2.tensors["token_embd.weight"]  # Q8_0, the tied output head; its first 4096 rows
    assert embd.type == Q.Q8_0
    rows = 4096
    head = TensorInfo(embd.name, (rows, embd.shape[1]), embd.type, embd.data[: rows * embd.data.size // embd.shape[0]])
    _assert_tracks_reference(head, x)


def test_real_model_native_holds_the_files_bytes_once(smollm2):
    """Native weights are the file's blocks: memory-mapped, or (Q4_0/Q4_1/Q8_0 where the CPU has AVX512-VNNI)
    the same bytes repacked into tiles, the mapped pages released."""
    tensor = smollm2.tensors["blk.0.ffn_up.weight"]
    native, f32 = Linear(tensor), Linear(tensor, fmt="f32")
    if WEIGHT_TYPES[tensor.type].plan(cpu.TIER).layout == "tiles":
        assert native.weight_bytes == tensor.data.nbytes and native._w is None
    else:
        assert native.weight_bytes == 0
        assert np.shares_memory(native._w, tensor.data)
    assert f32.weight_bytes == 4 * tensor.shape[0] * tensor.shape[1]
    x = activations(3, tensor.shape[1])
    np.testing.assert_allclose(native(x), f32(x), rtol=0, atol=0.05 * np.abs(f32(x)).max())


# ---------------------------------------------------------------- batch invariance


def _assert_batch_invariant(qtype: Q, tier: str | None = None) -> None:
    tensor = random_tensor(qtype, 48, 512, seed=11)
    layer = Linear(tensor, tier=tier)
    row = activations(1, 512, seed=5)
    alone = layer(row)
    for n_tokens in (2, 7, 8, 16, 17, 37, 200):
        batch = activations(n_tokens, 512, seed=n_tokens)
        for position in sorted({0, n_tokens // 2, n_tokens - 1}):
            batch[position] = row[0]
            np.testing.assert_array_equal(layer(batch)[position], alone[0], err_msg=f"T={n_tokens} at {position}")


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_batch_invariance_bitwise(qtype, tier):
    """One row alone, and inside batches of 2 to 200 rows at several positions: identical bits."""
    _assert_batch_invariant(qtype, tier)


@pytest.mark.parametrize("qtype", FLOAT_TYPES, ids=lambda t: t.name)
def test_batch_invariance_bitwise_floats(qtype):
    _assert_batch_invariant(qtype)


@pytest.mark.parametrize("tier", [_tier_param(name) for name in cpu.runnable() if cpu.TIERS[name].int8_dot])
@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_a_lone_row_quantized_in_the_kernel_has_the_two_calls_bits(qtype, tier):
    """At one row the tile kernel quantizes the row itself (Linear._lone_row): the bits of the quantizer's call then
    the kernel's, which several rows take (every tier with tiles: those with int8 dots)."""
    layer = Linear(random_tensor(qtype, 40, 512, seed=7), tier=tier)
    x = activations(1, 512, seed=8)
    t, tiles = layer._tiles, layer._kernels().tiles
    two_calls = np.empty((1, 40), np.float32)
    if qtype in SUPERBLOCK:
        a = (quantize_q8_k if natural_order(qtype, layer.tier) else quantize_q8_k_quads)(x)
        tiles(t.quants, t.scales, t.mins, t.sub_scales, a.q, a.d, a.sum32, two_calls, np.zeros((0, 0), np.float32))
    else:
        a = quantize_q8_32(x)
        tiles(t.quants, t.scales, t.mins, a.q, a.d, a.s, a.qsum, two_calls, np.zeros((0, 0), np.float32))
    np.testing.assert_array_equal(layer._lone_row(x), two_calls)
    np.testing.assert_array_equal(layer(x), two_calls)


def _every_tier_param(qtype):
    """Q4_1 (the default model's type) and Q4_K (the K-quants') in the default run; each other type compiles every
    tier's kernels of its own from a cold numba cache, so it is slow."""
    return pytest.param(qtype, id=qtype.name, marks=() if qtype.name in ("Q4_1", "Q4_K") else pytest.mark.slow)


@pytest.mark.parametrize("qtype", [_every_tier_param(qtype) for qtype in QUANT_TYPES])
def test_every_tiers_kernels_agree_bitwise(qtype):
    """Every tier this machine can execute (tiles, row by row, VNNI lanes, portable lanes) against the portable
    tier; 81 rows: an odd last row, and a last tile of one row."""
    tensor = random_tensor(qtype, 81, 1024, seed=3)
    portable = Linear(tensor, tier="portable")
    layers = {name: Linear(tensor, tier=name) for name in cpu.runnable()}
    for name, layer in layers.items():
        tiled = cpu.TIERS[name].int8_dot != ""  # every quantized type is tiled where a tier has int8 dots
        assert (layer._tiles is not None) == tiled, name
    for n_tokens in (1, 2, 3, 5, 8, 9, 16, 19, 50):
        x = activations(n_tokens, 1024, seed=n_tokens)
        expected = portable(x)
        for name, layer in layers.items():
            np.testing.assert_array_equal(layer(x), expected, err_msg=f"{name}, T={n_tokens}")


# ---------------------------------------------------------------- construction


def test_fused_tensors_back_to_back_stay_one_view():
    q, k, v = (random_tensor(Q.F16, rows, 256, seed=rows) for rows in (64, 32, 32))  # a type never repacked
    buffer = np.concatenate([q.data, k.data, v.data])  # as a GGUF file lays them out
    views, start = [], 0
    for t in (q, k, v):
        views.append(TensorInfo(t.name, t.shape, t.type, buffer[start : start + t.data.size]))
        start += t.data.size
    fused = Linear.fused(views)
    assert fused.weight_bytes == 0 and np.shares_memory(fused._w, buffer)
    scattered = Linear.fused([q, k, v])
    assert scattered.weight_bytes == buffer.nbytes
    x = activations(9, 256)
    expected = np.concatenate([Linear(t)(x) for t in (q, k, v)], axis=1)
    np.testing.assert_array_equal(fused(x), expected)
    np.testing.assert_array_equal(scattered(x), expected)


def test_fused_tensors_of_two_types_make_one_layer_per_run_of_a_type():
    """A Q4_K_M file's attn_q and attn_k (Q4_K) beside a Q6_K attn_v: two layers, the Q4_K pair fused."""
    q, k, v = (
        random_tensor(Q.Q4_K, 64, 256, seed=1),
        random_tensor(Q.Q4_K, 32, 256, seed=2),
        random_tensor(Q.Q6_K, 32, 256, seed=3),
    )
    stack = Linear.fused([q, k, v])
    assert [layer.out_features for layer in stack.layers] == [96, 32] and stack.out_features == 128
    x = activations(5, 256)
    np.testing.assert_array_equal(stack(x), np.concatenate([Linear(t)(x) for t in (q, k, v)], axis=1))


def _resident_file_bytes() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("RssFile:"))


@pytest.mark.parametrize("tier", [t for t in cpu.runnable() if cpu.TIERS[t].int8_dot])
def test_a_repacked_tensor_releases_the_files_pages(tmp_path, tier):
    """The file's pages under a repacked tensor leave the process's resident memory, so the weights are
    held once, not twice."""
    import gguf

    rows, cols = 4096, 2048
    blocks = np.random.default_rng(0).integers(0, 256, (rows * cols // 32, 18), dtype=np.uint8)
    writer = gguf.GGUFWriter(str(tmp_path / "one.gguf"), "llama")
    writer.add_tensor("w", blocks.reshape(rows, cols // 32 * 18), raw_dtype=Q.Q4_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tensor = GGUFFile(tmp_path / "one.gguf").tensors["w"]
    assert int(tensor.data.sum()) > 0  # every page of the tensor read in
    before = _resident_file_bytes()
    layer = Linear(tensor, tier=tier)
    assert layer.weight_bytes == tensor.data.nbytes
    assert before - _resident_file_bytes() > 0.9 * tensor.data.nbytes


def test_bad_input_is_one_clear_error():
    layer = Linear(random_tensor(Q.Q4_0, 8, 64))
    with pytest.raises(ValueError, match=r"expected x of shape \(T, 64\)"):
        layer(np.zeros((2, 32), np.float32))
    with pytest.raises(ValueError, match="fmt must be"):
        Linear(random_tensor(Q.Q4_0, 8, 64), fmt="int4")
    assert layer(np.zeros((0, 64), np.float32)).shape == (0, 8)
