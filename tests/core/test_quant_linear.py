"""miro.core.layers.linear.Linear with weights kept as GGUF blocks: llama.cpp's scheme, accuracy, batch invariance.

The reference here is a plain numpy transcription of ggml's reference code: the activation
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
from miro.core.kernels.weight_types import WEIGHT_TYPES

F32 = np.float32
# the types of each activation format, from the table of weight types (core/kernels/weight_types.py)
BLOCK32 = [t for t, row in WEIGHT_TYPES.items() if row.activations == "q8_0"]
SUPERBLOCK = [t for t, row in WEIGHT_TYPES.items() if row.activations == "q8_k"]
QUANT_TYPES = BLOCK32 + SUPERBLOCK
FLOAT_TYPES = [t for t, row in WEIGHT_TYPES.items() if row.activations == "f32"]


# ---------------------------------------------------------------- test data


def _f16(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float16).view(np.uint8).reshape(-1, 2)


def random_tensor(qtype: Q, rows: int, cols: int, seed: int = 0) -> TensorInfo:
    """A (rows, cols) tensor of `qtype`: gguf-py's quantizer where it has one, else random valid blocks."""
    rng = np.random.default_rng(seed)
    weights = (rng.standard_normal((rows, cols)) * 0.05).astype(F32)
    if qtype in FLOAT_TYPES:
        data = gguf_quants.quantize(weights, qtype) if qtype != Q.F32 else weights
        return TensorInfo(
            f"random_{qtype.name}", (rows, cols), qtype, np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        )
    if qtype in BLOCK32:
        data = gguf_quants.quantize(weights, qtype)
        return TensorInfo(f"random_{qtype.name}", (rows, cols), qtype, data.reshape(-1))
    # K-quants: gguf-py cannot quantize them; random bytes with finite, small float16 scales
    n_blocks = rows * cols // 256
    block_bytes = GGML_QUANT_SIZES[qtype][1]
    blocks = rng.integers(0, 256, (n_blocks, block_bytes), dtype=np.uint8)
    scales = _f16(rng.uniform(1e-4, 2e-3, n_blocks))
    if qtype == Q.Q6_K:
        blocks[:, 208:210] = scales
    else:
        blocks[:, 0:2] = scales
        blocks[:, 2:4] = _f16(rng.uniform(1e-4, 2e-3, n_blocks))
    return TensorInfo(f"random_{qtype.name}", (rows, cols), qtype, blocks.reshape(-1))


def activations(rows: int, cols: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(F32)
    x[:, ::97] *= 8  # a few large values per row, as real hidden states have
    return x


# ---------------------------------------------------------------- ggml's reference, in numpy


def _roundf(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.float64)
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def ref_quantize_q8_32(x: np.ndarray):
    """quantize_row_q8_0_ref plus q8_1's s: (q int64 (T, nb, 32), d f32 (T, nb), s f32 (T, nb))."""
    blocks = x.reshape(x.shape[0], -1, 32)
    d = (np.abs(blocks).max(axis=2) / F32(127)).astype(F32)
    inv = np.where(d != 0, F32(1) / np.where(d != 0, d, F32(1)), F32(0)).astype(F32)
    q = _roundf((blocks * inv[..., None]).astype(F32)).astype(np.int64)
    s = (q.sum(axis=2).astype(F32) * d).astype(np.float16).astype(F32)
    return q, d.astype(np.float16).astype(F32), s


def ref_quantize_q8_k(x: np.ndarray):
    """quantize_row_q8_K_ref: (q int64 (T, nb, 256), d f32 (T, nb))."""
    blocks = x.reshape(x.shape[0], -1, 256)
    first_max = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=2)[..., None], axis=2)[..., 0]
    safe = np.where(first_max != 0, first_max, F32(1))
    iscale = (F32(-127) / safe).astype(F32)
    q = np.minimum(127, np.rint((blocks * iscale[..., None]).astype(F32))).astype(np.int64)
    q[first_max == 0] = 0
    d = np.where(first_max != 0, (F32(1) / iscale).astype(F32), F32(0))
    return q, d


def _halfs(blocks: np.ndarray, at: int) -> np.ndarray:
    return blocks[:, :, at : at + 2].copy().view(np.float16)[..., 0].astype(F32)


def ref_decode(tensor: TensorInfo):
    """The weights' integers and scales per block, as ggml's dot products see them."""
    rows, cols = tensor.shape
    block_values, block_bytes = GGML_QUANT_SIZES[tensor.type]
    b = tensor.data.reshape(rows, cols // block_values, block_bytes).astype(np.int64)
    t = tensor.type
    if t == Q.Q8_0:
        return dict(q=b[:, :, 2:].astype(np.uint8).view(np.int8).astype(np.int64), d=_halfs(b.astype(np.uint8), 0))
    if t == Q.MXFP4:  # ggml-common.h kvalues_mxfp4 (E2M1 doubled), d = GGML_E8M0_TO_FP32_HALF(e) = 2^(e - 128)
        kvalues = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int64)
        qs = b[:, :, 1:17]
        return dict(
            q=kvalues[np.concatenate([qs & 15, qs >> 4], axis=2)], d=np.ldexp(F32(1), b[:, :, 0] - 128).astype(F32)
        )
    if t in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1):
        nib = {Q.Q4_0: 2, Q.Q4_1: 4, Q.Q5_0: 6, Q.Q5_1: 8}[t]
        qs = b[:, :, nib : nib + 16]
        q = np.concatenate([qs & 15, qs >> 4], axis=2)
        if t in (Q.Q5_0, Q.Q5_1):
            qh_at = nib - 4
            qh = b[:, :, qh_at] | (b[:, :, qh_at + 1] << 8) | (b[:, :, qh_at + 2] << 16) | (b[:, :, qh_at + 3] << 24)
            q = q | (((qh[..., None] >> np.arange(32)) & 1) << 4)
        u8 = b.astype(np.uint8)
        out = dict(q=q - {Q.Q4_0: 8, Q.Q5_0: 16}.get(t, 0), d=_halfs(u8, 0))
        if t in (Q.Q4_1, Q.Q5_1):
            out["m"] = _halfs(u8, 2)
        return out
    u8 = b.astype(np.uint8)
    if t == Q.Q6_K:
        ql, qh = b[:, :, :128], b[:, :, 128:192]
        q = np.empty(b.shape[:2] + (256,), np.int64)
        for half in range(2):
            lo, lo2, h = (
                ql[..., 64 * half : 64 * half + 32],
                ql[..., 64 * half + 32 : 64 * half + 64],
                qh[..., 32 * half : 32 * half + 32],
            )
            e = 128 * half
            q[..., e : e + 32] = (lo & 15) | ((h & 3) << 4)
            q[..., e + 32 : e + 64] = (lo2 & 15) | (((h >> 2) & 3) << 4)
            q[..., e + 64 : e + 96] = (lo >> 4) | (((h >> 4) & 3) << 4)
            q[..., e + 96 : e + 128] = (lo2 >> 4) | (((h >> 6) & 3) << 4)
        sc = u8[:, :, 192:208].view(np.int8).astype(np.int64)
        return dict(q=q - 32, sc=np.repeat(sc, 16, axis=2), d=_halfs(u8, 208))
    s = b[:, :, 4:16]
    sc = np.empty(b.shape[:2] + (8,), np.int64)
    mn = np.empty_like(sc)
    sc[..., :4], mn[..., :4] = s[..., 0:4] & 63, s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    qs = b[:, :, 16:144] if t == Q.Q4_K else b[:, :, 48:176]
    q = np.empty(b.shape[:2] + (256,), np.int64)
    for c in range(4):
        q[..., 64 * c : 64 * c + 32] = qs[..., 32 * c : 32 * c + 32] & 15
        q[..., 64 * c + 32 : 64 * c + 64] = qs[..., 32 * c : 32 * c + 32] >> 4
    if t == Q.Q5_K:
        qh = b[:, :, 16:48]
        q += ((np.tile(qh, 8) >> np.repeat(np.arange(8), 32)) & 1) << 4
    return dict(q=q, sc=np.repeat(sc, 32, axis=2), m=mn, d=_halfs(u8, 0), dmin=_halfs(u8, 2))


def ref_dequantize(tensor: TensorInfo) -> np.ndarray:
    """W in float64 from ref_decode (checked against gguf-py's dequantizer below)."""
    w = ref_decode(tensor)
    if "sc" not in w:
        values = w["q"] * w["d"][..., None].astype(np.float64)
        if "m" in w:
            values = values + w["m"][..., None]
    else:
        values = w["d"][..., None].astype(np.float64) * w["sc"] * w["q"]
        if "m" in w:
            values = values - (w["dmin"][..., None] * np.repeat(w["m"], 32, axis=2))
    return values.reshape(tensor.shape)


def ref_native(tensor: TensorInfo, x: np.ndarray) -> np.ndarray:
    """llama.cpp's CPU result for x @ W.T: ggml's generic vec_dot (32-value blocks) or x86 repack kernel (K-quants)."""
    t = tensor.type
    w = ref_decode(tensor)
    if t in BLOCK32:
        q, d, s = ref_quantize_q8_32(x)
        isum = np.einsum("nbj,tbj->tnb", w["q"], q).astype(F32)  # exact: |sum| < 2^24
        sumf = np.zeros((x.shape[0], tensor.shape[0]), F32)
        for b in range(q.shape[1]):
            dw, dx = w["d"][None, :, b], d[:, b, None]
            if t == Q.Q4_0:
                sumf = sumf + (isum[:, :, b] * dw) * dx
            elif t in (Q.Q4_1, Q.Q5_1):
                sumf = sumf + ((dw * dx) * isum[:, :, b] + w["m"][None, :, b] * s[:, b, None])
            else:
                sumf = sumf + (dw * dx) * isum[:, :, b]
        return sumf
    # the K-quants as ggml's x86 repack kernel (ggml_gemm_q4_K_8x8_q8_K): per super-block one float step of its
    # exact integer sum, the mins in an accumulator of their own
    q, d = ref_quantize_q8_k(x)
    n_tok, n_out, n_super = x.shape[0], tensor.shape[0], q.shape[1]
    acc = np.zeros((n_tok, n_out), F32)
    acc_mins = np.zeros((n_tok, n_out), F32)
    for sb in range(n_super):
        isum = np.einsum("nj,tj->tn", w["sc"][:, sb] * w["q"][:, sb], q[:, sb]).astype(F32)  # rounded as vcvtdq2ps does
        acc = acc + (w["d"][None, :, sb] * d[:, sb, None]) * isum
        if "m" in w:
            bsum32 = q[:, sb].reshape(n_tok, 8, 32).sum(axis=2)
            sum_mins = (bsum32[:, None, :] * w["m"][None, :, sb]).sum(axis=2).astype(F32)
            acc_mins = acc_mins + (w["dmin"][None, :, sb] * d[:, sb, None]) * sum_mins
    return acc - acc_mins


def activation_error_bound(tensor: TensorInfo, x: np.ndarray) -> np.ndarray:
    """|W| @ |x - x_hat|, x_hat the activations as the 8-bit blocks hold them, plus float slack."""
    if tensor.type in SUPERBLOCK:
        q, d = ref_quantize_q8_k(x)
    else:
        q, d, _ = ref_quantize_q8_32(x)
    x_hat = (q * d[..., None]).reshape(x.shape)
    w_abs = np.abs(ref_dequantize(tensor))
    return np.abs(x - x_hat) @ w_abs.T + 2.0**-9 * (np.abs(x_hat) @ w_abs.T) + 1e-6


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
        blocks[:, 0:2] = _f16(rng.uniform(-2e-3, 2e-3, len(blocks)))
    if qtype in (Q.Q4_1, Q.Q5_1):
        blocks[:, 2:4] = _f16(rng.uniform(-2e-2, 2e-2, len(blocks)))
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
        blocks[:, 208:210] = _f16(np.full(len(blocks), 1e-3))
    else:
        blocks[:, 0:4] = _f16(np.full(2 * len(blocks), 1e-3)).reshape(len(blocks), 4)
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


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
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
