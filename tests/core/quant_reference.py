"""The tests' quantized tensors and ggml's reference arithmetic, in plain numpy: random tensors of every weight
type, activations with a few large values, and a transcription of ggml's reference code (the activation
quantizers quantize_row_q8_0_ref / _q8_1_ref / _q8_K_ref and the generic vec_dot functions: integer sums per
block, float32 accumulation in ggml's order) that the native kernels are held to (test_quant_linear.py)."""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q
from gguf import quants as gguf_quants

from miro.core.loading.gguf_file import TensorInfo
from miro.core.kernels.weight_types import WEIGHT_TYPES

F32 = np.float32
# the types of each activation format, from the table of weight types (core/kernels/weight_types.py)
BLOCK32 = [t for t, row in WEIGHT_TYPES.items() if row.activations == "q8_0"]
SUPERBLOCK = [t for t, row in WEIGHT_TYPES.items() if row.activations == "q8_k"]
QUANT_TYPES = BLOCK32 + SUPERBLOCK
FLOAT_TYPES = [t for t, row in WEIGHT_TYPES.items() if row.activations == "f32"]


# ---------------------------------------------------------------- test data


def f16_bytes(values) -> np.ndarray:
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
    scales = f16_bytes(rng.uniform(1e-4, 2e-3, n_blocks))
    if qtype == Q.Q6_K:
        blocks[:, 208:210] = scales
    else:
        blocks[:, 0:2] = scales
        blocks[:, 2:4] = f16_bytes(rng.uniform(1e-4, 2e-3, n_blocks))
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
