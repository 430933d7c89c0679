"""numba kernels for the forward pass: RMSNorm (per row or per head), RoPE (adjacent pairs or NEOX halves)
+ KV-cache write, SiLU and GELU gates, paged flash attention (causal, optionally over a sliding window), GEMM.

Every kernel computes each token's row from that row alone (and, for
attention, from that token's own context), in a fixed order, so a token's
result never depends on what else is in the batch.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .layers.halfs import f32_to_f16_bits


@njit(cache=True, fastmath=True)
def rmsnorm(x, weight, eps, out):
    """out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight, for each row t."""
    n, d = x.shape
    for t in range(n):
        acc = 0.0
        for i in range(d):
            acc += x[t, i] * x[t, i]
        inv = np.float32(1.0 / math.sqrt(acc / d + eps))
        for i in range(d):
            out[t, i] = x[t, i] * inv * weight[i]
    return out


@njit(cache=True, fastmath=True)
def silu_mul(gate_up, out):
    """out = silu(gate) * up, where gate_up holds [gate | up] column halves."""
    n, two_f = gate_up.shape
    f = two_f // 2
    for t in range(n):
        for i in range(f):
            g = gate_up[t, i]
            out[t, i] = g / (np.float32(1.0) + np.exp(-g)) * gate_up[t, f + i]
    return out


def _gelu_f16_table() -> np.ndarray:
    """GELU (tanh form) of every float16, rounded to float16: the table ggml evaluates GELU through."""
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(all="ignore"):  # inf and nan entries are never looked up (|x| >= 10 bypasses the table)
        y = np.float32(0.5) * x * (np.float32(1.0) + np.tanh(
            np.float32(math.sqrt(2.0 / math.pi)) * x * (np.float32(1.0) + np.float32(0.044715) * x * x)))
    return y.astype(np.float16).astype(np.float32)


_GELU_F16 = _gelu_f16_table()


@njit(cache=True)
def _gelu_mul(gate_up, table, out):
    n, two_f = gate_up.shape
    f = two_f // 2
    for t in range(n):
        for i in range(f):
            g = gate_up[t, i]
            if g <= np.float32(-10.0):
                y = np.float32(0.0)
            elif g >= np.float32(10.0):
                y = g
            else:
                y = table[f32_to_f16_bits(g)]
            out[t, i] = y * gate_up[t, f + i]
    return out


def gelu_mul(gate_up: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = gelu_tanh(gate) * up, where gate_up holds [gate | up] column halves.

    As ggml computes it: the gate rounded to float16 and looked up in a float16 table of GELU
    (|gate| >= 10: 0 or the gate itself), about 1e-3 relative from the exact function.
    """
    return _gelu_mul(gate_up, _GELU_F16, out)


@njit(cache=True, fastmath=True)
def head_rmsnorm(qkv, first_col, n_heads, head_dim, weight, eps):
    """RMSNorm over each of n_heads heads of head_dim columns from first_col of every row, in place
    (qwen3's and gemma3's q/k norm): qkv[t, head] = qkv[t, head] / rms(qkv[t, head]) * weight."""
    for t in range(qkv.shape[0]):
        for h in range(n_heads):
            c0 = first_col + h * head_dim
            acc = 0.0
            for i in range(head_dim):
                acc += qkv[t, c0 + i] * qkv[t, c0 + i]
            inv = np.float32(1.0 / math.sqrt(acc / head_dim + eps))
            for i in range(head_dim):
                qkv[t, c0 + i] = qkv[t, c0 + i] * inv * weight[i]
    return qkv


@njit(cache=True)
def _rotate_pairs(vec, cos_row, sin_row):
    """RoPE on adjacent pairs (x[2i], x[2i+1]), the rotation llama.cpp applies to GGUF llama weights."""
    for i in range(cos_row.shape[0]):
        a = vec[2 * i]
        b = vec[2 * i + 1]
        vec[2 * i] = a * cos_row[i] - b * sin_row[i]
        vec[2 * i + 1] = a * sin_row[i] + b * cos_row[i]


@njit(cache=True)
def _rotate_halves(vec, cos_row, sin_row):
    """NEOX RoPE: pairs (x[i], x[i + d/2]), the rotation llama.cpp applies to qwen2, qwen3 and gemma3."""
    half = cos_row.shape[0]
    for i in range(half):
        a = vec[i]
        b = vec[half + i]
        vec[i] = a * cos_row[i] - b * sin_row[i]
        vec[half + i] = a * sin_row[i] + b * cos_row[i]


@njit(cache=True)
def _rotate(vec, cos_row, sin_row, neox):
    if neox:
        _rotate_halves(vec, cos_row, sin_row)
    else:
        _rotate_pairs(vec, cos_row, sin_row)


@njit(cache=True)
def rope_and_store_kv(qkv, positions, cos, sin, n_heads, n_kv_heads, head_dim, slots, k_cache, v_cache, neox=False):
    """Rotate Q (in place in qkv) and K by each token's position; write K and V into the paged cache.

    qkv: (T, (n_heads + 2 * n_kv_heads) * head_dim); slots[t] = block * block_size + offset.
    k_cache, v_cache: (num_blocks, n_kv_heads, block_size, head_dim).
    neox: rotate halves (x[i], x[i + head_dim/2]) instead of adjacent pairs.
    """
    block_size = k_cache.shape[2]
    q_end = n_heads * head_dim
    k_end = q_end + n_kv_heads * head_dim
    for t in range(qkv.shape[0]):
        pos = positions[t]
        for h in range(n_heads):
            _rotate(qkv[t, h * head_dim:(h + 1) * head_dim], cos[pos], sin[pos], neox)
        block = slots[t] // block_size
        offset = slots[t] % block_size
        for h in range(n_kv_heads):
            k = qkv[t, q_end + h * head_dim:q_end + (h + 1) * head_dim]
            _rotate(k, cos[pos], sin[pos], neox)
            k_cache[block, h, offset, :] = k
            v_cache[block, h, offset, :] = qkv[t, k_end + h * head_dim:k_end + (h + 1) * head_dim]


@njit(cache=True, parallel=True, fastmath=True)
def paged_attention(q, k_cache, v_cache, block_tables, positions, items, scale, out, window=0):
    """Causal flash attention over a paged KV cache for a packed batch of query tokens.

    q: (T, n_heads, head_dim); out: same shape.
    block_tables: (S, max_blocks) int32 block ids per sequence.
    positions[t]: the position of query token t; it attends to positions 0..positions[t] of its sequence,
      or with window > 0 (a sliding-window layer) only to the last `window` of them,
      positions[t] - window + 1..positions[t]: blocks wholly before the tile's first window are never read.
    items: (W, 4) int32 rows (seq, kv_head, t_begin, t_end): one work item per sequence, KV head and
      tile of that sequence's query tokens. Every query head of the KV head's group shares each K/V load;
      an online softmax per query keeps memory O(tile), never the full score matrix.
    """
    n_heads = q.shape[1]
    head_dim = q.shape[2]
    n_kv_heads = k_cache.shape[1]
    block_size = k_cache.shape[2]
    group = n_heads // n_kv_heads
    for w in prange(items.shape[0]):
        seq = items[w, 0]
        kvh = items[w, 1]
        t_begin = items[w, 2]
        n_q = (items[w, 3] - t_begin) * group
        m = np.full(n_q, -np.inf, dtype=np.float32)
        l = np.zeros(n_q, dtype=np.float32)
        acc = np.zeros((n_q, head_dim), dtype=np.float32)
        scores = np.empty(block_size, dtype=np.float32)
        max_pos = positions[items[w, 3] - 1]
        first_block = 0
        if window > 0:
            first_block = max(positions[t_begin] - window + 1, 0) // block_size
        for b in range(first_block, (max_pos // block_size) + 1):
            block = block_tables[seq, b]
            base = b * block_size
            for qi in range(n_q):
                t = t_begin + qi // group
                h = kvh * group + qi % group
                n_valid = min(positions[t] + 1 - base, block_size)
                first = 0
                if window > 0:
                    first = max(positions[t] - window + 1 - base, 0)
                if n_valid <= first:
                    continue
                block_max = m[qi]
                for j in range(first, n_valid):
                    s = np.float32(0.0)
                    for d in range(head_dim):
                        s += q[t, h, d] * k_cache[block, kvh, j, d]
                    s *= scale
                    scores[j] = s
                    block_max = max(block_max, s)
                correction = np.exp(m[qi] - block_max)
                l[qi] *= correction
                for d in range(head_dim):
                    acc[qi, d] *= correction
                for j in range(first, n_valid):
                    p = np.exp(scores[j] - block_max)
                    l[qi] += p
                    for d in range(head_dim):
                        acc[qi, d] += p * v_cache[block, kvh, j, d]
                m[qi] = block_max
        for qi in range(n_q):
            t = t_begin + qi // group
            h = kvh * group + qi % group
            inv = np.float32(1.0) / l[qi]
            for d in range(head_dim):
                out[t, h, d] = acc[qi, d] * inv
    return out


def rope_tables(head_dim: int, theta: float, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin for positions start..stop-1, (stop - start, head_dim // 2) float32, computed in float32
    as HF transformers does."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = np.float32(1.0) / np.power(np.float32(theta), exponents, dtype=np.float32)
    angles = np.outer(np.arange(start, stop).astype(np.float32), inv_freq).astype(np.float32)
    return np.cos(angles), np.sin(angles)


@njit(cache=True, nogil=True)
def mask_rows(logits, rows, bits, emptied):
    """Structured output: logits[rows[j], t] = -inf for every token t whose bit is clear in bits[j] (packed int32
    words, bit t % 32 of word t // 32). emptied[j] is set when no finite logit is left in that row."""
    vocab = logits.shape[1]
    for j in range(rows.shape[0]):
        row = rows[j]
        finite_left = False
        for w in range(bits.shape[1]):
            word = bits[j, w]
            base = w * 32
            for b in range(min(32, vocab - base)):
                if (word >> b) & 1:
                    if np.isfinite(logits[row, base + b]):
                        finite_left = True
                else:
                    logits[row, base + b] = -np.inf
        emptied[j] = not finite_left
