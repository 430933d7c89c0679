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


@njit(cache=True, parallel=True)
def layernorm(x, weight, bias, eps, out):
    """out[t] = (x[t] - mean) / sqrt(var + eps) * weight + bias, statistics in float64 (out may be x)."""
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
def add_bias_gelu(x, bias):
    """x = gelu(x + bias) in place, HF's "gelu": 0.5 v (1 + erf(v / sqrt 2)), not the tanh approximation."""
    n, d = x.shape
    for t in prange(n):
        for i in range(d):
            v = x[t, i] + bias[i]
            x[t, i] = np.float32(0.5 * v * (1.0 + math.erf(v * 0.7071067811865476)))
    return x


@njit(cache=True, parallel=True)
def bidirectional_attention(qkv, bounds, n_heads, head_dim, scale, out):
    """out (T, n_heads * head_dim): softmax(q k^T * scale) v for each input and head, every query over all
    the keys of its own input. qkv (T, 3 * n_heads * head_dim): q, k, v side by side, as the fused layer gives."""
    n_inputs = len(bounds) - 1
    q_dim = n_heads * head_dim
    for work in prange(n_inputs * n_heads):
        s, h = work // n_heads, work % n_heads
        begin, end = bounds[s], bounds[s + 1]
        n = end - begin
        q_col, k_col, v_col = h * head_dim, q_dim + h * head_dim, 2 * q_dim + h * head_dim
        keys = np.empty((n, head_dim), np.float32)
        values = np.empty((n, head_dim), np.float32)
        for j in range(n):
            for c in range(head_dim):
                keys[j, c] = qkv[begin + j, k_col + c]
                values[j, c] = qkv[begin + j, v_col + c]
        scores = np.empty(n, np.float32)
        acc = np.empty(head_dim, np.float32)
        for i in range(n):
            best = -np.inf
            for j in range(n):
                dot = np.float32(0.0)
                for c in range(head_dim):
                    dot += qkv[begin + i, q_col + c] * keys[j, c]
                scores[j] = dot * scale
                best = max(best, scores[j])
            total = np.float32(0.0)
            for j in range(n):
                scores[j] = np.exp(scores[j] - best)
                total += scores[j]
            acc[:] = 0.0
            for j in range(n):
                weight = scores[j]
                for c in range(head_dim):
                    acc[c] += weight * values[j, c]
            inv = np.float32(1.0) / total
            for c in range(head_dim):
                out[begin + i, q_col + c] = acc[c] * inv
    return out
