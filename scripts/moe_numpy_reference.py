"""A float64 numpy forward of scripts/moe_files.py's mixture-of-experts files, written from scripts/moe_math.md,
checked against llama.cpp's logits in tests/fixtures/moe_llamacpp.{json,npz}: the math note, executable.

``forward(info, tokens, activation_rounding=True)`` gives the last position's logits for a file's
``write_moe_model`` result. With ``activation_rounding`` each matmul's input is rounded as llama.cpp's CPU matmul
rounds it for that weight type (vec_dot_type: none for F32, fp16 for F16, Q8_0 per 32 values, x86 style, for Q8_0
and MXFP4); without it the matmuls are plain float64 on the dequantized weights (what an f32 engine computes).
Attention runs on f64 K/V (llama.cpp's fa0-f32 setting). Runs without llama.cpp (miro's venv is enough):

    python scripts/moe_numpy_reference.py [--plain] [--prompts N] [NAME ...]

prints per file the largest |logit difference| from llama.cpp's fa0-f32 at each prompt length, next to llama.cpp's
own spread across its settings. Slow-ish on 2,500 tokens (a Python loop over tokens x chosen experts).
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from moe_files import write_moe_model  # noqa: E402

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
NEOX = ("qwen3moe", "olmoe", "gpt-oss")
RENORMALISED = ("llama", "qwen3moe", "granitemoe")


def round_q8_0(x: np.ndarray) -> np.ndarray:
    """ggml-cpu/arch/x86/quants.c quantize_row_q8_0 (AVX/AVX2), dequantized: per 32 values, fp16 d = amax / 127,
    q = round-half-even(x * (127 / amax)), all in f32."""
    b = np.asarray(x, dtype=np.float32).reshape(-1, 32)
    amax = np.abs(b).max(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
    q = np.rint(b * inv)
    d = (amax / np.float32(127.0)).astype(np.float16).astype(np.float64)
    return (q * d).reshape(np.shape(x))


class Weights:
    def __init__(self, info: dict, activation_rounding: bool):
        self.t = {n: a.astype(np.float64) for n, a in info["tensors"].items()}
        self.types = info["tensor_types"]
        self.rounding = activation_rounding

    def __getitem__(self, name):
        return self.t[name]

    def __contains__(self, name):
        return name in self.t

    def act(self, x: np.ndarray, name: str) -> np.ndarray:
        """x as llama.cpp's matmul with tensor `name` sees it."""
        kind = self.types[name] if self.rounding else "F32"
        if kind == "F16":
            return x.astype(np.float16).astype(np.float64)
        if kind in ("Q8_0", "MXFP4"):
            return round_q8_0(x)
        return x

    def mm(self, x: np.ndarray, name: str) -> np.ndarray:  # x (T, in) @ W(out, in).T
        return self.act(x, name) @ self.t[name].T


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope_cache(n_pos, n_rot, base, yarn=None):
    """cos, sin (n_pos, n_rot/2) as ggml's rope_yarn computes them; yarn = (factor, n_ctx_orig, beta_fast,
    beta_slow, attn_factor)."""
    i0 = np.arange(0, n_rot, 2)
    theta_extrap = np.arange(n_pos)[:, None] * base ** (-i0 / n_rot)
    if yarn is None:
        return np.cos(theta_extrap), np.sin(theta_extrap)
    factor, orig, beta_fast, beta_slow, attn_factor = yarn

    def corr_dim(b):
        return n_rot * math.log(orig / (b * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(0, math.floor(corr_dim(beta_fast))), min(n_rot - 1, math.ceil(corr_dim(beta_slow)))
    ramp = 1 - np.clip((i0 // 2 - low) / max(0.001, high - low), 0, 1)
    theta = theta_extrap / factor * (1 - ramp) + theta_extrap * ramp
    mscale = attn_factor * (1 + 0.1 * math.log(factor))
    return np.cos(theta) * mscale, np.sin(theta) * mscale


def rope(x, cos, sin, neox):  # x (T, H, n_rot)
    a, b = (x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]) if neox else (x[..., 0::2], x[..., 1::2])
    c, s = cos[:, None, :], sin[:, None, :]
    ra, rb = a * c - b * s, a * s + b * c
    if neox:
        return np.concatenate([ra, rb], -1)
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = ra, rb
    return out


def attention(q, k, v, scale, window=None, sinks=None):
    """Causal GQA attention; window: keys with p_q - p_k >= window masked; sinks: one extra logit per head."""
    T, H, _ = q.shape
    group = H // k.shape[1]
    pos = np.arange(T)
    masked = pos[None, :] > pos[:, None]
    if window:
        masked |= (pos[:, None] - pos[None, :]) >= window
    out = np.empty((T, H, v.shape[-1]))
    for h in range(H):
        z = q[:, h] @ k[:, h // group].T * scale
        z[masked] = -np.inf
        m = z.max(-1, keepdims=True)
        if sinks is not None:
            m = np.maximum(m, sinks[h])
        p = np.exp(z - m)
        den = p.sum(-1, keepdims=True) + (np.exp(sinks[h] - m) if sinks is not None else 0.0)
        out[:, h] = (p / den) @ v[:, h // group]
    return out


def silu(x):
    return x / (1 + np.exp(-x))


def moe_ffn(x, W: Weights, L: str, c: dict) -> np.ndarray:
    arch, k = c["arch"], c["n_expert_used"]
    logits = W.mm(x, f"{L}.ffn_gate_inp.weight")
    if arch == "gpt-oss":
        logits = logits + W[f"{L}.ffn_gate_inp.bias"]
        probs = logits  # SOFTMAX_WEIGHT
    else:
        e = np.exp(logits - logits.max(-1, keepdims=True))
        probs = e / e.sum(-1, keepdims=True)
    sel = np.argsort(-probs, axis=-1, kind="stable")[:, :k]  # descending, ties: lower index first
    w = np.take_along_axis(probs, sel, -1)
    if arch == "gpt-oss":
        w = np.exp(w - w.max(-1, keepdims=True))
        w = w / w.sum(-1, keepdims=True)
    if arch in RENORMALISED:
        w = w / np.maximum(w.sum(-1, keepdims=True), 6.103515625e-5)
    gate, up, down = (f"{L}.ffn_{n}_exps.weight" for n in ("gate", "up", "down"))
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        xg = W.act(x[t], gate)
        for j in range(k):
            e_ = sel[t, j]
            g, u = W[gate][e_] @ xg, W[up][e_] @ xg
            if arch == "gpt-oss":
                g = np.minimum(g + W[f"{L}.ffn_gate_exps.bias"][e_], 7.0)
                u = np.clip(u + W[f"{L}.ffn_up_exps.bias"][e_], -7.0, 7.0)
                a = g / (1 + np.exp(-1.702 * g)) * (u + 1)
            else:
                a = silu(g) * u
            y = W[down][e_] @ W.act(a, down)
            if arch == "gpt-oss":
                y = y + W[f"{L}.ffn_down_exps.bias"][e_]
            out[t] += w[t, j] * y
    if f"{L}.ffn_gate_shexp.weight" in W:  # Granite MoE Shared: always-on SwiGLU expert on the same x
        hs = silu(W.mm(x, f"{L}.ffn_gate_shexp.weight")) * W.mm(x, f"{L}.ffn_up_shexp.weight")
        out = out + W.mm(hs, f"{L}.ffn_down_shexp.weight")
    return out


def forward(info: dict, tokens: list[int], activation_rounding: bool = True) -> np.ndarray:
    """Logits after the last of `tokens` for a write_moe_model result."""
    W = Weights(info, activation_rounding)
    arch, eps = info["arch"], info["rms_eps"]
    H, KV, hd = info["n_heads"], info["n_kv_heads"], info["head_dim"]
    T = len(tokens)
    granite = arch == "granitemoe"
    x = W["token_embd.weight"][tokens]
    if granite:
        x = x * 2.0  # embedding_scale (moe_files.GRANITE_SCALES)
    yarn = (*info["yarn"], 32.0, 1.0, 1.0) if "yarn" in info else None
    cos, sin = rope_cache(T, hd, info["rope_theta"], yarn)
    for i in range(info["n_layers"]):
        L = f"blk.{i}"
        h = rms(x, W[f"{L}.attn_norm.weight"], eps)
        q, k, v = (W.mm(h, f"{L}.attn_{n}.weight") for n in "qkv")
        if arch == "gpt-oss":
            q, k, v = q + W[f"{L}.attn_q.bias"], k + W[f"{L}.attn_k.bias"], v + W[f"{L}.attn_v.bias"]
        if arch == "olmoe":  # over the whole q / k
            q, k = rms(q, W[f"{L}.attn_q_norm.weight"], eps), rms(k, W[f"{L}.attn_k_norm.weight"], eps)
        q, k, v = q.reshape(T, H, hd), k.reshape(T, KV, hd), v.reshape(T, KV, hd)
        if arch == "qwen3moe":  # per head
            q, k = rms(q, W[f"{L}.attn_q_norm.weight"], eps), rms(k, W[f"{L}.attn_k_norm.weight"], eps)
        q, k = rope(q, cos, sin, arch in NEOX), rope(k, cos, sin, arch in NEOX)
        scale = 0.0625 if granite else 1 / math.sqrt(hd)  # granite: attention.scale
        window = info["sliding_window"] if arch == "gpt-oss" and i % 2 == 0 else None
        sinks = W[f"{L}.attn_sinks.weight"] if arch == "gpt-oss" else None
        a = W.mm(attention(q, k, v, scale, window, sinks).reshape(T, H * hd), f"{L}.attn_output.weight")
        if arch == "gpt-oss":
            a = a + W[f"{L}.attn_output.bias"]
        x = x + (a * 0.5 if granite else a)  # granite: residual_scale
        h = rms(x, W[f"{L}.post_attention_norm.weight" if arch == "gpt-oss" else f"{L}.ffn_norm.weight"], eps)
        f = moe_ffn(h, W, L, info)
        x = x + (f * 0.5 if granite else f)
    head = "output.weight" if "output.weight" in W else "token_embd.weight"
    logits = W.mm(rms(x[-1:], W["output_norm.weight"], eps), head)[0]
    return logits / 2.0 if granite else logits  # granite: logit_scale


def main(argv: list[str]) -> None:
    rounding = "--plain" not in argv
    n_prompts = int(argv[argv.index("--prompts") + 1]) if "--prompts" in argv else 3
    names = [a for a in argv if not a.startswith("--") and not a.isdigit()]
    meta = json.loads((FIXTURES / "moe_llamacpp.json").read_text())
    logits = np.load(FIXTURES / "moe_llamacpp.npz")
    with tempfile.TemporaryDirectory() as tmp:
        for v in meta["variants"]:
            if names and v["name"] not in names:
                continue
            info = write_moe_model(Path(tmp) / "f.gguf", v["variant"], v["tensor_type"])
            diffs = [
                float(
                    np.abs(forward(info, p, rounding) - logits[f"{v['name']}/{meta['reference_setting']}/p{i}"]).max()
                )
                for i, p in enumerate(meta["prompts"][:n_prompts])
            ]
            print(
                f"{v['name']:24s} numpy{'' if rounding else ' (plain f64)'} vs llama.cpp:",
                " ".join(f"{d:.5f}" for d in diffs),
                "| llama.cpp spread:",
                v["spread_vs_reference"],
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv[1:])
