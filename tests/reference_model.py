"""A plain float64 numpy llama forward pass, written from the architecture, for checking the fast path.

No cache, no kernels, no fused weights: every token of the sequence is run
through the full causal attention at once, as in llama2.c.
"""

import numpy as np

from miro.core.loading.model_config import ModelConfig
from miro.core.kernels.dequant import dequantize
from miro.core.loading.gguf_file import GGUFFile


def _rmsnorm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x, positions, theta):
    """x: (T, heads, head_dim); rotate adjacent pairs (x[2i], x[2i+1]) by position * theta^(-2i/d)."""
    d = x.shape[-1]
    freqs = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    angles = positions[:, None] * freqs[None, :]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def reference_logits(path, token_ids) -> np.ndarray:
    """float64 logits for every position of `token_ids`."""
    gguf = GGUFFile(path)
    cfg = ModelConfig.from_gguf(gguf)

    def w(name):
        return dequantize(gguf.tensors[name]).astype(np.float64)

    ids = np.asarray(token_ids)
    n = len(ids)
    positions = np.arange(n, dtype=np.float64)
    embd = w("token_embd.weight")
    x = embd[ids]
    mask = np.triu(np.full((n, n), -np.inf), k=1)
    group = cfg.n_heads // cfg.n_kv_heads
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        h = _rmsnorm(x, w(p + "attn_norm.weight"), cfg.rms_eps)
        q = (h @ w(p + "attn_q.weight").T).reshape(n, cfg.n_heads, cfg.head_dim)
        k = (h @ w(p + "attn_k.weight").T).reshape(n, cfg.n_kv_heads, cfg.head_dim)
        v = (h @ w(p + "attn_v.weight").T).reshape(n, cfg.n_kv_heads, cfg.head_dim)
        q, k = _rope(q, positions, cfg.rope_theta), _rope(k, positions, cfg.rope_theta)
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(cfg.head_dim) + mask
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("hts,shd->thd", probs, v).reshape(n, cfg.q_dim)
        x = x + attn @ w(p + "attn_output.weight").T
        h = _rmsnorm(x, w(p + "ffn_norm.weight"), cfg.rms_eps)
        gate, up = h @ w(p + "ffn_gate.weight").T, h @ w(p + "ffn_up.weight").T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w(p + "ffn_down.weight").T
    head = w("output.weight") if "output.weight" in gguf.tensors else embd
    return _rmsnorm(x, w("output_norm.weight"), cfg.rms_eps) @ head.T
