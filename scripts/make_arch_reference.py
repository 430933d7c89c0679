"""llama.cpp's logits and greedy tokens for tiny random llama, qwen2, qwen3 and gemma3 GGUFs.

Run from the repository root with the environment that has llama-cpp-python,
gguf and numpy (CPU only, about a minute on 2 cores):

    /path/to/venv-with-llama-cpp/bin/python scripts/make_arch_reference.py [tests/fixtures/arch_llamacpp.json]

For each architecture in ARCHS and each tensor type in TYPES it writes the tiny
model with tests/gguf_factory.py's ``write_tiny_model(**factory_kwargs)`` into a
temporary folder (fixed seed, so the file is byte-identical on every run: its
sha256 is recorded), loads it with ``llama_cpp.Llama(..., logits_all=True)``
(SETTINGS below: f32 KV cache, no flash attention) and, for each of the PROMPTS
(token-id lists, 3 to 40 tokens, three of them longer than gemma3's sliding
window of 8), evaluates the prompt in one batch, then takes N_NEW greedy steps
with llama.cpp's greedy sampler (``Llama.sample(temp=0)``; EOS does not stop it),
evaluating each chosen token on its own. No combination is skipped: K-quant rows
must be multiples of 256, so the factory gives K-quant models dim 256, ffn 512 and
n_heads * head_dim of 256 or 512.

Outputs (no machine paths recorded):

* ``arch_llamacpp.npz``: for model key ``{arch}-{type}`` and prompt i, array
  ``{arch}-{type}/p{i}`` float32 (n_prompt + N_NEW - 1, n_vocab): row j is the
  logits after token j of ``prompt + greedy[:-1]`` (rows < n_prompt from the
  prompt batch, later rows from one-token decode steps), so row n_prompt - 1 + k
  predicts ``greedy[k]``.
* ``arch_llamacpp.json``: settings, versions, prompts, the conventions llama.cpp
  applies per architecture (checked against REFERENCE below), and per model the
  factory kwargs, sha256 and size of the GGUF, its config, and per prompt the
  greedy ids, the top-1 minus top-2 logit margin of each greedy step, and the
  largest difference between llama.cpp's logits and ``reference_logits`` (an exact
  float64 forward pass of the documented conventions, written here from the
  architecture descriptions) -- the noise an exact float implementation should
  expect against llama.cpp (its matmuls quantize activations to Q8_0 / Q8_K) --,
  whether that exact pass picks the same greedy tokens (teacher-forced), and
  ``greedy_stable_prefix``: how many leading greedy steps have a margin above twice
  that step's noise (max over the vocabulary of |llama.cpp - exact|): up to there an
  exact implementation must pick llama.cpp's tokens; beyond it, it may rightly differ.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import math
import sys
import tempfile
from pathlib import Path

import gguf
import llama_cpp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from gguf_factory import tensor_name, write_tiny_model  # noqa: E402

MT = gguf.MODEL_TENSOR
ARCHS = ("llama", "qwen2", "qwen3", "gemma3")
TYPES = ("Q8_0", "Q4_0", "Q4_K")
SEED = 1
CONTEXT_LENGTH = 256
N_NEW = 16
SETTINGS = {
    "n_ctx": 256,
    "n_batch": 512,
    "n_ubatch": 512,
    "n_threads": 2,
    "logits_all": True,
    "flash_attn": False,
    "type_k": "f32",
    "type_v": "f32",
    "swa_full": "llama.cpp default (true)",
    "seed": "unused (greedy)",
}
_rng = np.random.default_rng(20250)
# Token ids 3..271 (0-2 are the control tokens); lengths 3, 11, 24 and 40.
PROMPTS = [[int(t) for t in _rng.integers(3, 272, size=n)] for n in (3, 11, 24, 40)]

CONVENTIONS = {
    "all": {
        "rms_norm": "x / sqrt(mean(x^2) + eps) * w, w as stored (no +1)",
        "attention": "causal softmax(q k^T * scale) v, GQA: query head h uses kv head h // (n_heads / n_kv_heads)",
        "tied_output": "output.weight absent -> logits = final_norm(x) @ token_embd^T",
        "numerics": "quantized matmuls quantize the activations first (Q8_0 blocks of 32 with an f16 scale for "
        "Q8_0/Q4_0 weights, Q8_K blocks of 256 for Q4_K); norms, rope, softmax in f32; "
        "KV cache f32 here (type_k/type_v), llama.cpp's default would be f16",
    },
    "llama": {
        "rope": "NORM: rotate adjacent pairs (x[2i], x[2i+1]) by pos * theta^(-2i/head_dim)",
        "ffn": "down(silu(gate(x)) * up(x))",
        "scale": "1/sqrt(head_dim)",
    },
    "qwen2": {
        "rope": "NEOX: rotate (x[i], x[i + head_dim/2]) by pos * theta^(-2i/head_dim)",
        "bias": "q, k, v = x W^T + b (attn_q/k/v.bias, F32); no output bias",
        "ffn": "down(silu(gate(x)) * up(x))",
        "scale": "1/sqrt(head_dim)",
    },
    "qwen3": {
        "rope": "NEOX",
        "qk_norm": "RMSNorm over each head's head_dim of q and k (attn_q_norm/attn_k_norm, "
        "eps = rms_eps), after the projection, before RoPE",
        "head_dim": "attention.key_length (here 2 * dim / n_heads), q proj (n_heads*head_dim, dim)",
        "ffn": "down(silu(gate(x)) * up(x))",
        "scale": "1/sqrt(head_dim)",
    },
    "gemma3": {
        "embedding": "token_embd row * sqrt(dim) (f32 sqrtf(n_embd)), before layer 0",
        "rope": "NEOX",
        "layer": "h += post_attention_norm(attn(attn_norm(h))); h += post_ffw_norm(ffn(ffn_norm(h)))",
        "qk_norm": "per-head RMSNorm of q and k (attn_q_norm/attn_k_norm) before RoPE",
        "norm_weights": "multiplied as stored: HF's (1 + w) was folded in by the converter (convert_hf_to_gguf adds "
        "1 to every *norm.weight), so the GGUF stores 1 + w_hf",
        "ffn": "down(gelu_tanh(gate(x)) * up(x)); ggml evaluates this GELU through an fp16 table "
        "(input rounded to f16, output f16), |diff| vs exact tanh GELU ~1e-3 relative",
        "scale": "q * 1/sqrt(head_dim) (hparams.f_attention_scale; 1/sqrt(dim/n_heads) only for the 62-layer "
        "27B); no query_pre_attn_scalar key is read",
        "sliding_window": "layer i is local (sliding) iff i % 6 < 5 (global: 5, 11, 17, ...); a local layer's query "
        "at position p sees keys at positions p - n_swa < k <= p (n_swa = attention.sliding_window "
        "keys including itself)",
        "rope_theta": "global layers rope.freq_base; local layers 10000 (hard-coded in llama.cpp's gemma3 "
        "loader: rope_freq_base_train_swa = 10000; the converter writes no rope.freq_base_swa)",
        "softcapping": "none (the sliding-window graph does not apply final_logit_softcapping)",
    },
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---- an exact float64 forward pass of the conventions above ---------------------------------


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x, positions, theta, neox):
    d = x.shape[-1]
    angles = positions[:, None] * theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)[None, :]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    if neox:
        a, b = x[..., : d // 2], x[..., d // 2 :]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    out = np.empty_like(x)
    a, b = x[..., 0::2], x[..., 1::2]
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
    return out


def reference_logits(info: dict, token_ids: list[int]) -> np.ndarray:
    """float64 logits for every position, from the factory's dequantized tensors."""
    arch = info["layout"]
    t = {name: np.asarray(a, dtype=np.float64) for name, a in info["tensors"].items()}
    eps, hd, nh, nkv = info["rms_eps"], info["head_dim"], info["n_heads"], info["n_kv_heads"]
    ids = np.asarray(token_ids)
    n = len(ids)
    pos = np.arange(n, dtype=np.float64)
    x = t[tensor_name(MT.TOKEN_EMBD)][ids]
    if arch == "gemma3":
        x = x * math.sqrt(info["dim"])
    for i in range(info["n_layers"]):

        def w(kind, suffix="weight"):
            return t[tensor_name(kind, i, suffix)]

        h = _rms(x, w(MT.ATTN_NORM), eps)
        q, k, v = h @ w(MT.ATTN_Q).T, h @ w(MT.ATTN_K).T, h @ w(MT.ATTN_V).T
        if arch == "qwen2":
            q, k, v = q + w(MT.ATTN_Q, "bias"), k + w(MT.ATTN_K, "bias"), v + w(MT.ATTN_V, "bias")
        q, k, v = q.reshape(n, nh, hd), k.reshape(n, nkv, hd), v.reshape(n, nkv, hd)
        if arch in ("qwen3", "gemma3"):
            q, k = _rms(q, w(MT.ATTN_Q_NORM), eps), _rms(k, w(MT.ATTN_K_NORM), eps)
        local = arch == "gemma3" and i % 6 < 5
        theta = 10000.0 if local else info["rope_theta"]
        q, k = _rope(q, pos, theta, arch != "llama"), _rope(k, pos, theta, arch != "llama")
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
        qi, ki = np.arange(n)[:, None], np.arange(n)[None, :]
        masked = (ki > qi) | ((qi - ki >= info["sliding_window"]) if local else False)
        s = np.where(masked[None], -np.inf, np.einsum("thd,shd->hts", q, k) / math.sqrt(hd))
        p = np.exp(s - s.max(-1, keepdims=True))
        o = np.einsum("hts,shd->thd", p / p.sum(-1, keepdims=True), v).reshape(n, nh * hd) @ w(MT.ATTN_OUT).T
        if arch == "gemma3":
            o = _rms(o, w(MT.ATTN_POST_NORM), eps)
        x = x + o
        h = _rms(x, w(MT.FFN_NORM), eps)
        g, u = h @ w(MT.FFN_GATE).T, h @ w(MT.FFN_UP).T
        if arch == "gemma3":
            act = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))
        else:
            act = g / (1 + np.exp(-g))
        y = (act * u) @ w(MT.FFN_DOWN).T
        if arch == "gemma3":
            y = _rms(y, w(MT.FFN_POST_NORM), eps)
        x = x + y
    head = t.get(tensor_name(MT.OUTPUT), t[tensor_name(MT.TOKEN_EMBD)])
    return _rms(x, t[tensor_name(MT.OUTPUT_NORM)], eps) @ head.T


# ---- llama.cpp ------------------------------------------------------------------------------


def run_model(path: Path, info: dict) -> tuple[list[dict], dict[str, np.ndarray]]:
    llm = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=SETTINGS["n_ctx"],
        n_batch=SETTINGS["n_batch"],
        n_ubatch=SETTINGS["n_ubatch"],
        n_threads=SETTINGS["n_threads"],
        logits_all=True,
        flash_attn=False,
        type_k=llama_cpp.GGML_TYPE_F32,
        type_v=llama_cpp.GGML_TYPE_F32,
        verbose=False,
    )
    assert llm.n_vocab() == info["vocab_size"]
    runs, arrays = [], {}
    for i, prompt in enumerate(PROMPTS):
        llm.reset()
        llm.eval(prompt)
        greedy = []
        for step in range(N_NEW):
            token = int(llm.sample(temp=0.0, repeat_penalty=1.0))
            greedy.append(token)
            if step < N_NEW - 1:
                llm.eval([token])
        n_rows = len(prompt) + N_NEW - 1
        logits = np.array(llm.scores[:n_rows], dtype=np.float32, copy=True)
        assert np.isfinite(logits).all()
        steps = logits[len(prompt) - 1 :]
        assert [int(r.argmax()) for r in steps] == greedy, "llama.cpp's greedy token is not the argmax"
        top2 = np.sort(steps, axis=1)[:, -2:]
        exact = reference_logits(info, prompt + greedy[:-1])
        arrays[f"{info['key']}/p{i}"] = logits
        margins = top2[:, 1] - top2[:, 0]
        row_noise = np.abs(exact - logits).max(axis=1)
        noise = float(row_noise.max())
        step_noise = row_noise[len(prompt) - 1 :]
        stable = next((k for k, m in enumerate(margins) if m <= 2 * step_noise[k]), N_NEW)
        runs.append(
            {
                "prompt_index": i,
                "n_prompt": len(prompt),
                "n_rows": n_rows,
                "greedy_ids": greedy,
                "greedy_margins": [round(float(m), 6) for m in margins],
                "max_abs_diff_vs_exact_float64": round(noise, 6),
                "exact_float64_greedy_agrees": [int(r.argmax()) for r in exact[len(prompt) - 1 :]] == greedy,
                "greedy_stable_prefix": stable,
            }
        )
    llm.close()
    return runs, arrays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "out",
        nargs="?",
        type=Path,
        default=ROOT / "tests" / "fixtures" / "arch_llamacpp.json",
        help="the JSON to write; the logits go next to it with the suffix .npz",
    )
    args = parser.parse_args()
    out_json, out_npz = args.out.with_suffix(".json"), args.out.with_suffix(".npz")

    models, arrays = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for arch in ARCHS:
            for ttype in TYPES:
                key = f"{arch}-{ttype}"
                kwargs = {"arch": arch, "tensor_type": ttype, "seed": SEED, "context_length": CONTEXT_LENGTH}
                path = Path(tmp) / f"{key}.gguf"
                info = write_tiny_model(path, **kwargs)
                info["key"] = key
                runs, model_arrays = run_model(path, info)
                arrays.update(model_arrays)
                config = {
                    k: info[k]
                    for k in (
                        "n_layers",
                        "dim",
                        "n_heads",
                        "n_kv_heads",
                        "head_dim",
                        "ffn_dim",
                        "context_length",
                        "tie_embeddings",
                        "rope_theta",
                        "rms_eps",
                        "sliding_window",
                        "vocab_size",
                    )
                }
                if arch == "gemma3":
                    config["local_layers"] = [i for i in range(info["n_layers"]) if i % 6 < 5]
                    config["rope_theta_local"] = 10000.0
                models.append(
                    {
                        "key": key,
                        "arch": arch,
                        "tensor_type": ttype,
                        "factory_kwargs": kwargs,
                        "sha256": sha256(path),
                        "file_size": path.stat().st_size,
                        "config": config,
                        "tensor_types": info["tensor_types"],
                        "runs": runs,
                    }
                )
                worst = max(r["max_abs_diff_vs_exact_float64"] for r in runs)
                print(
                    f"{key:12s} {models[-1]['sha256'][:12]} greedy p3 {runs[3]['greedy_ids'][:6]} "
                    f"max|llama.cpp - exact| {worst:.4f}"
                )

    fixture = {
        "description": "llama.cpp (llama-cpp-python) logits and greedy tokens for tiny random GGUFs written by "
        "tests/gguf_factory.py write_tiny_model; see scripts/make_arch_reference.py",
        "llama_cpp_python_version": llama_cpp.__version__,
        "gguf_version": importlib.metadata.version("gguf"),
        "numpy_version": np.__version__,
        "settings": SETTINGS,
        "n_new_tokens": N_NEW,
        "greedy": "llama.cpp's greedy sampler (Llama.sample(temp=0)) after the prompt batch, then one token per "
        "decode step; EOS does not stop it",
        "logits": f"{out_npz.name}: '<model key>/p<prompt index>' float32 (n_prompt + {N_NEW - 1}, n_vocab); row j "
        "follows token j of prompt + greedy_ids[:-1]",
        "prompts": PROMPTS,
        "skipped": {},
        "skipped_note": "none: every architecture exists in Q8_0, Q4_0 and Q4_K (K-quant models use dim 256, ffn 512)",
        "conventions": CONVENTIONS,
        "models": models,
    }
    out_json.write_text(json.dumps(fixture, indent=1) + "\n")
    np.savez_compressed(out_npz, **arrays)
    print(f"wrote {out_json.name} ({out_json.stat().st_size} B) and {out_npz.name} ({out_npz.stat().st_size} B)")


if __name__ == "__main__":
    main()
