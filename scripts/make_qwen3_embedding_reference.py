"""llama.cpp's last-token-pooled embeddings of tiny random qwen3 GGUFs (tests/gguf_factory.py's writer).

Run from the repository root with the project's venv (gguf, numpy); it runs llama.cpp in its own
interpreter (CPU only, 2 threads, under a minute):

    .venv/bin/python scripts/make_qwen3_embedding_reference.py \\
        --llama-python VENV_WITH_LLAMA_CPP/bin/python

For each tensor type in TYPES the project venv writes the model with
``write_tiny_model(path, **factory_kwargs)`` (fixed seed: byte-identical on every run) with the metadata
key ``qwen3.pooling_type`` = 3 (gguf.PoolingType.LAST). The factory can only add a new key as INT32,
which llama.cpp refuses (``key qwen3.pooling_type has wrong type i32 but expected type u32``), so the
key's 4-byte type id is then overwritten in place with UINT32 (``as_uint32``: same size, same value
bytes; the json records the byte offset and both files' sha256). The script then re-invokes itself as
``--stage llama`` under ``--llama-python``, which loads the file with ``Llama(embedding=True)`` (pooling
from the file) and decodes each of the PROMPTS (token-id lists, 1 to 100 tokens, some ending in
<|endoftext|> = 2 as Qwen3-Embedding inputs do) as one sequence and reads llama_get_embeddings_seq:
with pooling LAST that is the final-normed (output_norm) hidden state of the sequence's last token,
unnormalized. It does so under each of VARIANTS (KV cache type, flash attention, n_ubatch smaller than
a prompt, all prompts as sequences of one batch): llama.cpp's own spread, which a reimplementation is
held to. ``exact_hidden`` is a float64 forward pass of the same conventions (those of
scripts/make_arch_reference.py) from the factory's dequantized tensors, for scale.

Outputs (no machine paths recorded):

* ``tests/fixtures/qwen3_last_pooling_llamacpp.npz``: per model key ``qwen3-{type}``:
  ``{key}/raw`` float32 (n_prompts, dim): the base settings' embeddings as llama.cpp returns them;
  ``{key}/normalized``: the same divided by their L2 norm; ``{key}/exact``: float64 reference;
  ``{key}/variant/{name}``: raw embeddings under each other variant.
* ``tests/fixtures/qwen3_last_pooling_llamacpp.json``: versions, settings, prompts, per model the factory
  kwargs, the uint32 patch, sha256s, config, and the figures: min cosine of each variant against the
  base, min pairwise cosine over all variants, and each against the exact float64 pass.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "qwen3_last_pooling_llamacpp.json"
TYPES = ("F32", "Q8_0")
SEED = 7
CONTEXT_LENGTH = 512
POOLING_KEY, POOLING_LAST = "qwen3.pooling_type", 3
THREADS = 2
BASE = {
    "n_ctx": 512,
    "n_batch": 512,
    "n_ubatch": 512,
    "n_threads": THREADS,
    "flash_attn": False,
    "type_kv": "f16 (llama.cpp's default)",
    "batch": "one sequence per decode",
}
VARIANTS = {  # name -> what differs from BASE
    "kv_f32": {"type_kv": "f32"},
    "flash_attn": {"flash_attn": True},
    "flash_attn_kv_f32": {"flash_attn": True, "type_kv": "f32"},
    "n_ubatch_7": {"n_ubatch": 7},
    "all_prompts_one_batch": {"batch": "all prompts as sequences 0..7 of one decode"},
}
_rng = np.random.default_rng(2024)
# Token ids 3..271 (0-2 are the control tokens); the last three prompts end in <|endoftext|> (2).
PROMPTS = [[int(t) for t in _rng.integers(3, 272, size=n)] for n in (1, 2, 5, 9, 17)]
PROMPTS += [[int(t) for t in _rng.integers(3, 272, size=n - 1)] + [2] for n in (32, 63, 100)]


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


# ---- the file (project venv) ----------------------------------------------------------------


def factory_kwargs(tensor_type: str) -> dict:
    return {
        "arch": "qwen3",
        "tensor_type": tensor_type,
        "seed": SEED,
        "context_length": CONTEXT_LENGTH,
        "metadata": {POOLING_KEY: POOLING_LAST},
    }


def as_uint32(path: Path, key: str) -> int:
    """Overwrite the type id of an INT32 metadata key with UINT32 in place; returns its file offset."""
    import gguf

    field = gguf.GGUFReader(str(path)).fields[key]
    assert field.types == [gguf.GGUFValueType.INT32], field.types
    pos = int(field.offset + field.parts[0].nbytes + field.parts[1].nbytes)  # key length, key, then type
    with open(path, "r+b") as f:
        f.seek(pos)
        assert struct.unpack("<I", f.read(4))[0] == gguf.GGUFValueType.INT32
        f.seek(pos)
        f.write(struct.pack("<I", gguf.GGUFValueType.UINT32))
    return pos


def write_model(path: Path, tensor_type: str) -> tuple[dict, dict]:
    sys.path.insert(0, str(ROOT / "tests"))
    from gguf_factory import write_tiny_model

    info = write_tiny_model(path, **factory_kwargs(tensor_type))
    factory_sha = sha256(path)
    offset = as_uint32(path, POOLING_KEY)
    patch = {
        "key": POOLING_KEY,
        "type_id_offset": offset,
        "from": "INT32 (5)",
        "to": "UINT32 (4)",
        "factory_sha256": factory_sha,
        "sha256": sha256(path),
        "file_size": path.stat().st_size,
    }
    return info, patch


# ---- an exact float64 forward pass (qwen3 conventions of scripts/make_arch_reference.py) -----


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope_neox(x, theta):
    n, d = x.shape[0], x.shape[-1]
    angles = np.arange(n, dtype=np.float64)[:, None] * theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)[None]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def exact_hidden(info: dict, ids: list[int]) -> np.ndarray:
    """float64 output_norm(h) of the last token: causal attention, per-head q/k RMSNorm, NEOX RoPE, SwiGLU."""
    t = {name: np.asarray(a, np.float64) for name, a in info["tensors"].items()}
    eps, hd, nh, nkv, n = info["rms_eps"], info["head_dim"], info["n_heads"], info["n_kv_heads"], len(ids)
    x = t["token_embd.weight"][np.asarray(ids)]
    causal = np.triu(np.ones((n, n), bool), 1)
    for i in range(info["n_layers"]):
        w = lambda name: t[f"blk.{i}.{name}.weight"]  # noqa: E731
        h = _rms(x, w("attn_norm"), eps)
        q, k, v = (
            (h @ w("attn_q").T).reshape(n, nh, hd),
            (h @ w("attn_k").T).reshape(n, nkv, hd),
            (h @ w("attn_v").T).reshape(n, nkv, hd),
        )
        q, k = (
            _rope_neox(_rms(q, w("attn_q_norm"), eps), info["rope_theta"]),
            _rope_neox(_rms(k, w("attn_k_norm"), eps), info["rope_theta"]),
        )
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
        s = np.where(causal[None], -np.inf, np.einsum("thd,shd->hts", q, k) / math.sqrt(hd))
        p = np.exp(s - s.max(-1, keepdims=True))
        x = x + np.einsum("hts,shd->thd", p / p.sum(-1, keepdims=True), v).reshape(n, nh * hd) @ w("attn_output").T
        h = _rms(x, w("ffn_norm"), eps)
        g = h @ w("ffn_gate").T
        x = x + (g / (1 + np.exp(-g)) * (h @ w("ffn_up").T)) @ w("ffn_down").T
    return _rms(x[-1], t["output_norm.weight"], eps)


# ---- llama.cpp (--llama-python) -------------------------------------------------------------


def stage_llama(gguf_path: Path, out: Path) -> None:
    import llama_cpp
    from llama_cpp import Llama

    def load(s: dict) -> Llama:
        kv = llama_cpp.GGML_TYPE_F32 if s["type_kv"] == "f32" else None
        return Llama(
            model_path=str(gguf_path),
            embedding=True,
            n_ctx=s["n_ctx"],
            n_batch=s["n_batch"],
            n_ubatch=s["n_ubatch"],
            n_threads=s["n_threads"],
            n_threads_batch=s["n_threads"],
            flash_attn=s["flash_attn"],
            type_k=kv,
            type_v=kv,
            verbose=False,
        )

    def decode(llm: Llama, prompts: list[list[int]]) -> np.ndarray:
        llm._batch.reset()
        for seq, ids in enumerate(prompts):
            llm._batch.add_sequence(ids, seq, True)  # every token an output, as Llama.embed does
        llm._ctx.kv_cache_clear()
        llm._ctx.decode(llm._batch)
        n = llm.n_embd()
        rows = [llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, s)[:n] for s in range(len(prompts))]
        return np.array(rows, np.float32)

    results = {}
    for name, over in {"base": {}, **VARIANTS}.items():
        s = {**BASE, **over}
        llm = load(s)
        assert llm.pooling_type() == POOLING_LAST, llm.pooling_type()
        if s["batch"] == BASE["batch"]:
            results[name] = np.concatenate([decode(llm, [p]) for p in PROMPTS])
        else:
            results[name] = decode(llm, PROMPTS)
        llm.close()
    np.savez(out, **results)
    Path(str(out) + ".json").write_text(json.dumps({"llama_cpp_python": llama_cpp.__version__}))


# ---- main (project venv) --------------------------------------------------------------------


def spread(results: dict[str, np.ndarray], exact: np.ndarray) -> dict:
    rnd = lambda x: round(float(x), 7)  # noqa: E731
    names = list(results)
    pairwise = min(cosines(results[a], results[b]).min() for a in names for b in names if a < b)
    return {
        "min_cosine_vs_base": {n: rnd(cosines(results[n], results["base"]).min()) for n in names if n != "base"},
        "min_pairwise_cosine_all_settings": rnd(pairwise),
        "max_abs_diff_vs_base": {n: rnd(np.abs(results[n] - results["base"]).max()) for n in names if n != "base"},
        "min_cosine_vs_exact_float64": {n: rnd(cosines(results[n], exact).min()) for n in names},
        "max_abs_diff_vs_exact_float64": {n: rnd(np.abs(results[n] - exact).max()) for n in names},
        "norms_base": [rnd(x) for x in np.linalg.norm(results["base"].astype(np.float64), axis=1)],
    }


def run_model(tensor_type: str, tmp: Path, llama_python: str) -> tuple[dict, dict[str, np.ndarray]]:
    key = f"qwen3-{tensor_type}"
    path = tmp / f"{key}.gguf"
    info, patch = write_model(path, tensor_type)
    out = tmp / f"{key}.npz"
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
    subprocess.run(
        [llama_python, str(Path(__file__).resolve()), "--stage", "llama", "--gguf", str(path), "--out", str(out)],
        check=True,
        env=env,
    )
    results = dict(np.load(out))
    versions = json.loads(Path(str(out) + ".json").read_text())
    exact = np.stack([exact_hidden(info, p) for p in PROMPTS])
    raw = results["base"]
    arrays = {
        f"{key}/raw": raw,
        f"{key}/normalized": (raw / np.linalg.norm(raw, axis=1, keepdims=True)).astype(np.float32),
        f"{key}/exact": exact,
    }
    arrays.update({f"{key}/variant/{n}": a for n, a in results.items() if n != "base"})
    kwargs = factory_kwargs(tensor_type)
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
            "vocab_size",
        )
    }
    model = {
        "key": key,
        "factory_kwargs": kwargs,
        "uint32_patch": patch,
        "config": config,
        "tensor_types": sorted(set(info["tensor_types"].values())),
        "figures": spread(results, exact),
        "llama_cpp_python": versions["llama_cpp_python"],
    }
    return model, arrays


def main_stage(args) -> None:
    models, arrays = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for tensor_type in TYPES:
            model, model_arrays = run_model(tensor_type, Path(tmp), args.llama_python)
            models.append(model)
            arrays.update(model_arrays)
            fig = model["figures"]
            print(
                f"{model['key']:10s} {model['uint32_patch']['sha256'][:12]} spread (min pairwise cosine) "
                f"{fig['min_pairwise_cosine_all_settings']}, vs exact {fig['min_cosine_vs_exact_float64']}"
            )
    fixture = {
        "description": "llama.cpp (llama-cpp-python) last-token-pooled embeddings of tiny random qwen3 GGUFs "
        "written by tests/gguf_factory.py write_tiny_model; "
        "see scripts/make_qwen3_embedding_reference.py",
        "llama_cpp_python_version": models[0]["llama_cpp_python"],
        "gguf_version": importlib.metadata.version("gguf"),
        "numpy_version": np.__version__,
        "regenerate": ".venv/bin/python scripts/make_qwen3_embedding_reference.py --llama-python "
        "<venv with llama-cpp-python>/bin/python",
        "file": "write_tiny_model(path, **factory_kwargs), then uint32_patch: the 4 bytes at type_id_offset "
        "(the type id of qwen3.pooling_type) set to 4 (UINT32); llama.cpp refuses the INT32 key",
        "pooling": "LAST (3): the embedding is output_norm(h) of each sequence's last token, as "
        "llama_get_embeddings_seq returns it (unnormalized); causal attention",
        "llama_cpp_calls": "Llama(path, embedding=True, n_ctx, n_batch, n_ubatch, n_threads, n_threads_batch, "
        "flash_attn, type_k=type_v); batch.add_sequence(ids, seq_id, logits_all=True); "
        "kv_cache_clear(); decode(batch); llama_get_embeddings_seq(ctx, seq_id)",
        "base_settings": BASE,
        "variants": VARIANTS,
        "prompts": PROMPTS,
        "arrays": f"{OUT.with_suffix('.npz').name}: '<key>/raw' float32 (n_prompts, dim) base settings, unnormalized; "
        "'<key>/normalized' the same / L2 norm; '<key>/exact' float64 reference; "
        "'<key>/variant/<name>' float32 raw under each variant",
        "models": models,
    }
    OUT.write_text(json.dumps(fixture, indent=1) + "\n")
    npz = OUT.with_suffix(".npz")
    np.savez_compressed(npz, **arrays)
    print(f"wrote {OUT.name} ({OUT.stat().st_size} B) and {npz.name} ({npz.stat().st_size} B)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", choices=("main", "llama"), default="main", help=argparse.SUPPRESS)
    parser.add_argument("--llama-python", help="python of a venv with llama-cpp-python")
    parser.add_argument("--gguf", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stage == "llama":
        stage_llama(args.gguf, args.out)
    else:
        main_stage(args)


if __name__ == "__main__":
    main()
