"""Per-row kernels of the forward pass: RMSNorm (per row, after the residual add, or per head), SiLU, GELU and
gpt-oss's SwiGLU gates.
(RoPE + the KV-cache write and paged attention: layers/attention.py.)

Every kernel computes each token's row from that row alone, in a fixed order,
so a token's result never depends on what else is in the batch.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from miro.core.kernels.cache_key import HELPERS
from miro.core.kernels.halfs import f32_to_f16_bits
from miro.core.kernels.quantize_activations import PARALLEL_FROM
from miro.core.kernels.simd import LANES, exp1, exp16, load16, store16, zeros16


@njit(inline="always")
def _sum_of_squares(x, t, start, n):
    """sum of x[t, start + i]^2 for i < n, each square in float32, summed in float64 in one order on every CPU
    tier: 8 chains (value i to chain i % 8; LLVM may run them as one vector, never reassociated), added
    pairwise, then the last few values. (ggml sums in double too, one by one.)"""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
    body = n - n % 8
    for i in range(start, start + body, 8):
        a0 += x[t, i] * x[t, i]
        a1 += x[t, i + 1] * x[t, i + 1]
        a2 += x[t, i + 2] * x[t, i + 2]
        a3 += x[t, i + 3] * x[t, i + 3]
        a4 += x[t, i + 4] * x[t, i + 4]
        a5 += x[t, i + 5] * x[t, i + 5]
        a6 += x[t, i + 6] * x[t, i + 6]
        a7 += x[t, i + 7] * x[t, i + 7]
    total = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
    for i in range(start + body, start + n):
        total += x[t, i] * x[t, i]
    return total


@njit(inline="always")
def _normalize_row(x, t, weight, eps, out):
    """out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight."""
    d = x.shape[1]
    inv = np.float32(1.0 / math.sqrt(_sum_of_squares(x, t, 0, d) / d + eps))
    for i in range(d):
        out[t, i] = x[t, i] * inv * weight[i]


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray) -> np.ndarray:
    """out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight, for each row t (out may be x)."""
    return _rmsnorm(x, weight, eps, out, x.size >= PARALLEL_FROM)


def add_rmsnorm(x: np.ndarray, h: np.ndarray | None, weight: np.ndarray, eps: float, out: np.ndarray) -> np.ndarray:
    """x += h (the residual add, in place), then out = RMSNorm(x) * weight, in one pass over each row; h None: the
    norm alone."""
    if h is None:
        return rmsnorm(x, weight, eps, out)
    return _add_rmsnorm(x, h, weight, eps, out, x.size >= PARALLEL_FROM)


# The row kernels below split their rows over the thread pool only from PARALLEL_FROM values, as the row quantizers
# do (quantize_activations.py): a decode step's few rows would wait longer for the other core of a busy machine than
# they take. `parallel` picks the loop; one compilation holds both.


@njit(cache=True, parallel=True)
def _rmsnorm(x, weight, eps, out, parallel):
    if parallel:
        for t in prange(x.shape[0]):
            _normalize_row(x, t, weight, eps, out)
    else:
        for t in range(x.shape[0]):
            _normalize_row(x, t, weight, eps, out)
    return out


@njit(inline="always")
def _add_row(x, h, t):
    """x[t] += h[t]: float32 adds, as numpy's x += h."""
    for i in range(x.shape[1]):
        x[t, i] += h[t, i]


@njit(cache=True, parallel=True)
def _add_rmsnorm(x, h, weight, eps, out, parallel):
    if parallel:
        for t in prange(x.shape[0]):
            _add_row(x, h, t)
            _normalize_row(x, t, weight, eps, out)
    else:
        for t in range(x.shape[0]):
            _add_row(x, h, t)
            _normalize_row(x, t, weight, eps, out)
    return out


SILU_CHUNK = 256  # columns of a row per work item of silu_mul


@njit(inline="always")
def _silu_mul_item(flat_in, flat_out, item, chunks, f):
    """One work item of silu_mul: SILU_CHUNK columns of one row, 16 at a time (the last few one by one, through
    the same polynomial)."""
    t = item // chunks
    c0 = (item % chunks) * SILU_CHUNK
    c1 = min(c0 + SILU_CHUNK, f)
    gate, up, to = t * 2 * f, t * 2 * f + f, t * f  # where row t's gate, up and output start
    c = c0
    while c + LANES <= c1:
        g = load16(flat_in, gate + c)
        store16(flat_out, to + c, g / (exp16(zeros16() - g) + np.float32(1.0)) * load16(flat_in, up + c))
        c += LANES
    for i in range(c, c1):
        g = flat_in[gate + i]
        flat_out[to + i] = g / (exp1(-g) + np.float32(1.0)) * flat_in[up + i]


def _build_silu_mul():
    helpers = HELPERS  # made here so that the kernel closes over HELPERS (see layers/cache_key.py)

    @njit(cache=True, parallel=True)
    def silu_mul_kernel(gate_up, out, parallel):
        """parallel: the work items split over the thread pool, else run on the calling thread (one compilation
        for both)."""
        helpers
        n, two_f = gate_up.shape
        f = two_f // 2
        chunks = -(-f // SILU_CHUNK)
        flat_in = gate_up.reshape(gate_up.size)
        flat_out = out.reshape(out.size)
        if parallel:
            for item in prange(n * chunks):
                _silu_mul_item(flat_in, flat_out, item, chunks, f)
        else:
            for item in range(n * chunks):
                _silu_mul_item(flat_in, flat_out, item, chunks, f)
        return out

    return silu_mul_kernel


_silu_mul = _build_silu_mul()


def silu_mul(gate_up: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = silu(gate) * up, where gate_up holds [gate | up] column halves: silu(g) = g / (1 + e^-g).

    Split over the thread pool only from PARALLEL_FROM values: a decode step's (64 x 1536 on the default model,
    35 us on one core) waited up to 1 ms a call for the other core of a busy 2-core machine."""
    return _silu_mul(gate_up, out, gate_up.size >= PARALLEL_FROM)


def _gelu_f16_table() -> np.ndarray:
    """GELU (tanh form) of every float16, rounded to float16: the table ggml evaluates GELU through."""
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(all="ignore"):  # inf and nan entries are never looked up (|x| >= 10 bypasses the table)
        y = (
            np.float32(0.5)
            * x
            * (
                np.float32(1.0)
                + np.tanh(np.float32(math.sqrt(2.0 / math.pi)) * x * (np.float32(1.0) + np.float32(0.044715) * x * x))
            )
        )
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


SWIGLU_OAI_ALPHA = np.float32(1.702)  # llama.cpp's build_moe_ffn constants for LLM_FFN_SWIGLU_OAI_MOE (gpt-oss)
SWIGLU_OAI_LIMIT = np.float32(7.0)


@njit(cache=True)
def _swiglu_oai(gate_up, alpha, limit, out):
    n, two_f = gate_up.shape
    f = two_f // 2
    for t in range(n):
        for i in range(f):
            x = min(gate_up[t, i], limit)
            y = min(max(gate_up[t, f + i], -limit), limit)
            out[t, i] = x / (np.float32(1.0) + np.exp(alpha * (-x))) * (y + np.float32(1.0))
    return out


def swiglu_oai(gate_up: np.ndarray, out: np.ndarray) -> np.ndarray:
    """gpt-oss's gate: out = g / (1 + e^(-1.702 g)) * (u + 1), the gate g clamped from above at 7 and the up u to
    [-7, 7], where gate_up holds [gate | up] column halves: ggml_compute_forward_swiglu_oai_f32's float32 steps."""
    return _swiglu_oai(gate_up, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT, out)


def head_rmsnorm(qkv, first_col, n_heads, head_dim, weight, eps):
    """RMSNorm over each of n_heads heads of head_dim columns from first_col of every row, in place
    (qwen3's and gemma3's q/k norm): qkv[t, head] = qkv[t, head] / rms(qkv[t, head]) * weight."""
    return _head_rmsnorm(
        qkv, first_col, n_heads, head_dim, weight, eps, qkv.shape[0] * n_heads * head_dim >= PARALLEL_FROM
    )


@njit(inline="always")
def _normalize_heads(qkv, t, first_col, n_heads, head_dim, weight, eps):
    for h in range(n_heads):
        c0 = first_col + h * head_dim
        inv = np.float32(1.0 / math.sqrt(_sum_of_squares(qkv, t, c0, head_dim) / head_dim + eps))
        for i in range(head_dim):
            qkv[t, c0 + i] = qkv[t, c0 + i] * inv * weight[i]


@njit(cache=True, parallel=True)
def _head_rmsnorm(qkv, first_col, n_heads, head_dim, weight, eps, parallel):
    if parallel:
        for t in prange(qkv.shape[0]):
            _normalize_heads(qkv, t, first_col, n_heads, head_dim, weight, eps)
    else:
        for t in range(qkv.shape[0]):
            _normalize_heads(qkv, t, first_col, n_heads, head_dim, weight, eps)
    return qkv
