"""numba kernels an encoder (BERT) needs beside the Linear layers: LayerNorm, the exact (erf) GELU, and
bidirectional attention over a packed batch of inputs, each input attending to its own tokens only.

Inputs are packed without padding: rows bounds[s]..bounds[s + 1] of every array are input s. Each kernel
computes a row (or an input's head) from that input's rows alone, in a fixed order, so an input's
vector never depends on what else shares its batch.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from miro.core.kernels.cache_key import HELPERS
from miro.core.kernels.simd import (
    LANES,
    abs16,
    exp16,
    fma,
    hmax,
    hsum,
    keep_lanes,
    lane0,
    load16,
    max16,
    splat16,
    store16,
    zeros16,
)

# Abramowitz and Stegun 7.1.26: erf(a) = 1 - t (A1 + t (A2 + ...)) e^(-a^2), t = 1 / (1 + P a), a >= 0,
# within 1.5e-7 of erf everywhere: far below what float32 activations carry
_P = np.float32(0.3275911)
_A1, _A2, _A3, _A4, _A5 = (np.float32(c) for c in (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429))
_SQRT_HALF = np.float32(0.7071067811865476)
QUERIES = 6  # query rows attention takes at a time (_six_queries)


def layernorm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float, out: np.ndarray) -> np.ndarray:
    """out[t] = (x[t] - mean) / sqrt(var + eps) * weight + bias (out may be x). A width of whole vectors takes 16
    columns at a time, its statistics in float32 as torch keeps them (16 running sums, then hsum's tree);
    another width goes column by column with float64 statistics."""
    if x.shape[1] % LANES == 0:
        return _layernorm_vectors(x, weight, bias, np.float32(eps), out)
    return _layernorm_columns(x, weight, bias, eps, out)


@njit(cache=True, parallel=True)
def _layernorm_columns(x, weight, bias, eps, out):
    n, d = x.shape
    for t in prange(n):
        total = 0.0
        for i in range(d):
            total += x[t, i]
        mean = total / d
        spread = 0.0
        for i in range(d):
            diff = x[t, i] - mean
            spread += diff * diff
        inv = 1.0 / math.sqrt(spread / d + eps)
        for i in range(d):
            out[t, i] = np.float32((x[t, i] - mean) * inv) * weight[i] + bias[i]
    return out


@njit(cache=True, parallel=True)
def _layernorm_vectors(x, weight, bias, eps, out):
    n, d = x.shape
    for t in prange(n):
        row, normed = x[t], out[t]
        total = zeros16()
        for i in range(0, d, LANES):
            total = total + load16(row, i)
        mean = hsum(total) / np.float32(d)
        spread = zeros16()
        for i in range(0, d, LANES):
            diff = load16(row, i) - mean
            spread = spread + diff * diff
        inv = np.float32(1.0) / np.sqrt(hsum(spread) / np.float32(d) + eps)
        for i in range(0, d, LANES):
            store16(normed, i, (load16(row, i) - mean) * inv * load16(weight, i) + load16(bias, i))
    return out


@njit(inline="always")
def gelu16(v):
    """HF's "gelu" 0.5 v (1 + erf(v / sqrt 2)) of 16 lanes, not the tanh approximation: 0.5 v + 0.5 |v| erf(|v| /
    sqrt 2), erf by A&S 7.1.26."""
    a = abs16(v) * _SQRT_HALF
    k = 1.0 / (a * _P + 1.0)
    poly = k * (((((k * _A5 + _A4) * k + _A3) * k + _A2) * k) + _A1)
    erf = 1.0 - poly * exp16(zeros16() - a * a)
    return v * 0.5 + abs16(v) * 0.5 * erf


@njit(inline="always")
def gelu1(value):
    """gelu16 of one float32: the same bits as a lane of it."""
    return lane0(gelu16(splat16(value)))


def _build_add_bias_gelu():
    helpers = HELPERS  # in numba's cache key: see cache_key.py

    @njit(cache=True, parallel=True)
    def add_bias_gelu(x, bias):
        """x = gelu(x + bias) in place (gelu16), 16 columns at a time, the rest one by one (gelu1: the same bits)."""
        helpers
        n, d = x.shape
        body = d - d % LANES
        for t in prange(n):
            row = x[t]
            for i in range(0, body, LANES):
                store16(row, i, gelu16(load16(row, i) + load16(bias, i)))
            for i in range(body, d):
                row[i] = gelu1(row[i] + bias[i])
        return x

    return add_bias_gelu


add_bias_gelu = _build_add_bias_gelu()


def _build_attention():
    helpers = HELPERS

    @njit(cache=True, parallel=True)
    def bidirectional_attention(qkv, bounds, n_heads, head_dim, scale, out):
        """out (T, n_heads * head_dim): softmax(q k^T * scale) v for each input and head, every query over all
        the keys of its own input. qkv (T, 3 * n_heads * head_dim): q, k, v side by side, as the fused layer
        gives. One work item per input, its heads in turn: K transposed (so 16 keys' scores are one vector),
        then for 6 queries at a time their scores (their maxima kept as vectors), softmax, and weighted sum of V
        read in place, 16 columns at a time."""
        helpers
        q_dim = n_heads * head_dim
        for s in prange(len(bounds) - 1):
            begin, n = bounds[s], bounds[s + 1] - bounds[s]
            padded = -(-n // LANES) * LANES
            keys_t = np.zeros(head_dim * padded, np.float32)  # keys_t[c * padded + j] = k[j, c]
            scores = np.empty((QUERIES, padded), np.float32)
            acc = np.empty((QUERIES, head_dim), np.float32)
            totals = np.empty(QUERIES, np.float32)
            for h in range(n_heads):
                q_col, k_col, v_col = h * head_dim, q_dim + h * head_dim, 2 * q_dim + h * head_dim
                for c in range(head_dim):
                    for j in range(n):
                        keys_t[c * padded + j] = qkv[begin + j, k_col + c]
                for i0 in range(0, n, QUERIES):
                    _six_queries(qkv, begin, n, i0, q_col, v_col, head_dim, padded, scale, keys_t, scores, acc, totals)
                    for k in range(min(QUERIES, n - i0)):
                        inv = np.float32(1.0) / totals[k]
                        row = out[begin + i0 + k]
                        if head_dim % LANES == 0:
                            for c0 in range(0, head_dim, LANES):
                                store16(row, q_col + c0, load16(acc[k], c0) * inv)
                        else:
                            for c in range(head_dim):
                                row[q_col + c] = acc[k, c] * inv
        return out

    return bidirectional_attention


@njit(inline="always")
def _six_queries(qkv, begin, n, i0, q_col, v_col, head_dim, padded, scale, keys_t, scores, acc, totals):
    """For queries i0..i0 + 5 of the input at `begin` (past its end: its last query again): acc[k] = their
    softmax-weighted sums of V before dividing by totals[k], the softmax's sums. Six queries share each key and
    value load: 6 independent chains of FMAs."""
    last = n - 1
    q0, q1, q2 = qkv[begin + i0], qkv[begin + min(i0 + 1, last)], qkv[begin + min(i0 + 2, last)]
    q3, q4, q5 = qkv[begin + min(i0 + 3, last)], qkv[begin + min(i0 + 4, last)], qkv[begin + min(i0 + 5, last)]
    m0 = m1 = m2 = m3 = m4 = m5 = zeros16() - np.inf
    for j0 in range(0, padded, LANES):
        d0 = d1 = d2 = d3 = d4 = d5 = zeros16()
        for c in range(head_dim):
            key = load16(keys_t, c * padded + j0)
            d0, d1, d2 = fma(q0[q_col + c], key, d0), fma(q1[q_col + c], key, d1), fma(q2[q_col + c], key, d2)
            d3, d4, d5 = fma(q3[q_col + c], key, d3), fma(q4[q_col + c], key, d4), fma(q5[q_col + c], key, d5)
        d0, d1 = keep_lanes(d0 * scale, 0, n - j0, -np.inf), keep_lanes(d1 * scale, 0, n - j0, -np.inf)
        d2, d3 = keep_lanes(d2 * scale, 0, n - j0, -np.inf), keep_lanes(d3 * scale, 0, n - j0, -np.inf)
        d4, d5 = keep_lanes(d4 * scale, 0, n - j0, -np.inf), keep_lanes(d5 * scale, 0, n - j0, -np.inf)
        m0, m1, m2 = max16(m0, d0), max16(m1, d1), max16(m2, d2)  # the padding's scores are -inf
        m3, m4, m5 = max16(m3, d3), max16(m4, d4), max16(m5, d5)
        store16(scores[0], j0, d0), store16(scores[1], j0, d1), store16(scores[2], j0, d2)
        store16(scores[3], j0, d3), store16(scores[4], j0, d4), store16(scores[5], j0, d5)
    for k, best in enumerate((hmax(m0), hmax(m1), hmax(m2), hmax(m3), hmax(m4), hmax(m5))):
        total = zeros16()  # softmax: e^(score - max)
        for j0 in range(0, padded, LANES):
            e = keep_lanes(exp16(load16(scores[k], j0) - best), 0, n - j0, 0.0)  # the padding's 0
            store16(scores[k], j0, e)
            total = total + e
        totals[k] = hsum(total)
    if head_dim % LANES == 0:
        for c0 in range(0, head_dim, LANES):
            w0 = w1 = w2 = w3 = w4 = w5 = zeros16()
            for j in range(n):
                value = load16(qkv[begin + j], v_col + c0)
                w0, w1, w2 = fma(scores[0, j], value, w0), fma(scores[1, j], value, w1), fma(scores[2, j], value, w2)
                w3, w4, w5 = fma(scores[3, j], value, w3), fma(scores[4, j], value, w4), fma(scores[5, j], value, w5)
            store16(acc[0], c0, w0), store16(acc[1], c0, w1), store16(acc[2], c0, w2)
            store16(acc[3], c0, w3), store16(acc[4], c0, w4), store16(acc[5], c0, w5)
    else:
        acc[:] = 0.0
        for k in range(QUERIES):
            for j in range(n):
                for c in range(head_dim):
                    acc[k, c] += scores[k, j] * qkv[begin + j, v_col + c]


bidirectional_attention = _build_attention()


def _build_rope_qk():
    helpers = HELPERS

    @njit(cache=True, parallel=True)
    def rope_qk(qkv, positions, cos, sin, n_heads, head_dim):
        """Rotate q and k of the fused qkv rows (T, 3 * n_heads * head_dim) in place by each token's position,
        NEOX style as llama.cpp rotates nomic-bert: pair i of a head is (x[i], x[i + n_rot / 2]), n_rot / 2 =
        cos.shape[1] (the dimensions past n_rot pass unrotated). v is left alone. A row's result is its own."""
        helpers
        half = cos.shape[1]
        for t in prange(qkv.shape[0]):
            row, c, s = qkv[t], cos[positions[t]], sin[positions[t]]
            for h in range(2 * n_heads):  # q's heads, then k's
                base = h * head_dim
                for i in range(half):
                    a, b = row[base + i], row[base + half + i]
                    row[base + i] = a * c[i] - b * s[i]
                    row[base + half + i] = a * s[i] + b * c[i]
        return qkv

    return rope_qk


rope_qk = _build_rope_qk()
