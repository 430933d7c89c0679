"""llama.cpp's embeddings of tiny random nomic-bert GGUFs (tests/nomic_bert_factory.py), mean-pooled and per token.

Run from the repository root with the project's venv (gguf, numpy); it runs llama.cpp in its own
interpreter (CPU only, 2 threads, under a minute):

    .venv/bin/python scripts/make_nomic_bert_reference.py --llama-python VENV_WITH_LLAMA_CPP/bin/python

For each of MODELS (F32, F16, Q8_0; F32 with linear and with YaRN RoPE scaling) the project venv writes
``write_tiny_nomic_bert(path, **factory_kwargs)``
(seeded: the same bytes on every run; the json records their sha256) and re-invokes itself as
``--stage llama`` under ``--llama-python``, which tokenizes each of TEXTS with llama.cpp's WPM tokenizer
(``tokenize(text, add_bos=True, special=False)``: [CLS] ... [SEP]) and embeds the ids under each of
SETTINGS, twice: with the file's pooling (mean: ``llama_get_embeddings_seq``, unnormalized) and with
pooling NONE (every token's final hidden state: ``llama_get_embeddings_ith``). The settings are llama.cpp's
own spread, which a reimplementation is held to: flash attention on or off (on, K and V go through
float16), one input per decode or the short inputs as sequences of one decode. ``exact`` is a float64
forward pass of llama.cpp's nomic-bert graph (src/models/bert.cpp) from the factory's dequantized
tensors, with and without RoPE: how far the vectors move when the positions are dropped.

Outputs (no machine paths recorded):

* ``tests/fixtures/nomic_bert_llamacpp.npz``: per model key (``nomic-bert-F32`` ...): ``{key}/ids``,
  ``{key}/offsets`` (int32, ragged: text i's ids are ids[offsets[i]:offsets[i + 1]]);
  ``{key}/{setting}/pooled`` float32 (n_texts, dim) per setting; ``{key}/base/tokens`` float32 (total
  tokens, dim), the base setting's per-token states of the unscaled files (the other settings' and the scaled
  files' only in the figures, to keep the fixture small); ``{key}/exact/pooled``,
  ``{key}/exact_no_rope/pooled`` (float64 passes).
* ``tests/fixtures/nomic_bert_llamacpp.json``: versions, settings, texts, per model the factory kwargs,
  sha256, config, and the figures: llama.cpp's spread across its settings (min pairwise cosine, max abs
  difference, pooled and per token), each setting against the float64 pass, and the float64 pass without
  RoPE against llama.cpp's base.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "nomic_bert_llamacpp.json"
SEED = 11
# model key -> write_tiny_nomic_bert's arguments beyond seed and context_length: the three weight types, and
# RoPE scaled as a file may have it (linear; YaRN over an original context of 128, so the 482-token text reaches
# far past it)
MODELS = {
    "nomic-bert-F32": {"tensor_type": "F32"},
    "nomic-bert-F16": {"tensor_type": "F16"},
    "nomic-bert-Q8_0": {"tensor_type": "Q8_0"},
    "nomic-bert-F32-linear2": {"tensor_type": "F32", "rope_scaling": {"type": "linear", "factor": 2.0}},
    "nomic-bert-F32-yarn4": {
        "tensor_type": "F32",
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_context_length": 128},
    },
}
CONTEXT_LENGTH = 512
THREADS = 2
BASE = {
    "n_ctx": 512,
    "n_batch": 512,
    "n_ubatch": 512,
    "n_threads": THREADS,
    "flash_attn": False,
    "batch": "one text per decode",
}
SETTINGS = {  # name -> what differs from BASE
    "base": {},
    "flash_attn": {"flash_attn": True},
    "short_texts_one_batch": {"batch": "the texts but the longest as sequences of one decode"},
}
_LONG = (
    "Rotary position embeddings rotate each pair of query and key dimensions by an angle that grows "
    "with the token's position, so the score between two tokens depends on how far apart they are. "
    "Nomic embed text uses them in place of the learned position table of the original model, with a "
    "gated feed forward layer and no biases. For search, a query and a document are prefixed with "
    "their task, and the model pools the last hidden states by their mean. "
)
TEXTS = [
    "a",
    "The model is testing embeddings, and 42!",
    "search_query: what is the position of the document in the text?",
    "search_document: Rotary embeddings encode where each token sits.",
    "the and of to in is it that for on with as was by",
    "Nomic embed text v1.5 has 768 dimensions; this one has 64.",
    (_LONG * 3)[:930],  # about 500 tokens with the tiny vocabulary (checked below: at most the context)
]


def factory_kwargs(key: str) -> dict:
    return {**MODELS[key], "seed": SEED, "context_length": CONTEXT_LENGTH}


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


# ---- an exact float64 forward pass of llama.cpp's nomic-bert graph ---------------------------


def _layernorm(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps) * w + b


def _rope_neox(x, theta, scaling):
    """ggml's NEOX rope of (n, heads, d) at positions 0..n-1; scaling as llama.cpp reads the file's rope.scaling
    keys: linear divides every angle by the factor; YaRN (ext_factor 1, beta_fast 32, beta_slow 1) mixes the
    divided and the undivided angle by a ramp over the pairs and multiplies cos and sin by 1 + 0.1 ln(factor)."""
    n, d = x.shape[0], x.shape[-1]
    angles = np.arange(n, dtype=np.float64)[:, None] * theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)[None]
    mscale = 1.0
    if scaling:
        interpolated = angles / scaling["factor"]
        if scaling["type"] == "linear":
            angles = interpolated
        else:
            orig = scaling["original_context_length"]
            corr = lambda turns: d * math.log(orig / (turns * 2 * math.pi)) / (2 * math.log(theta))  # noqa: E731
            low, high = max(0.0, math.floor(corr(32.0))), min(d - 1.0, math.ceil(corr(1.0)))
            ramp = 1 - np.clip((np.arange(d // 2) - low) / max(0.001, high - low), 0, 1)
            angles = interpolated * (1 - ramp) + angles * ramp
            mscale = 1 + 0.1 * math.log(scaling["factor"])
    cos, sin = mscale * np.cos(angles)[:, None, :], mscale * np.sin(angles)[:, None, :]
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def exact_tokens(info: dict, ids: list[int], rope: bool = True) -> np.ndarray:
    """float64 final hidden state of every token of one input (positions 0..n-1)."""
    t = {name: np.asarray(a, np.float64) for name, a in info["tensors"].items()}
    eps, hd, nh, n, d = info["norm_eps"], info["head_dim"], info["n_heads"], len(ids), info["dim"]
    x = t["token_embd.weight"][np.asarray(ids)] + t["token_types.weight"][0]
    x = _layernorm(x, t["token_embd_norm.weight"], t["token_embd_norm.bias"], eps)
    for i in range(info["n_layers"]):
        w = lambda name, s="weight": t[f"blk.{i}.{name}.{s}"]  # noqa: E731
        qkv = x @ w("attn_qkv").T
        q, k, v = (qkv[:, j * d : (j + 1) * d].reshape(n, nh, hd) for j in range(3))
        if rope:
            q, k = (_rope_neox(y, info["rope_theta"], info["rope_scaling"]) for y in (q, k))
        s = np.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
        p = np.exp(s - s.max(-1, keepdims=True))
        o = np.einsum("hts,shd->thd", p / p.sum(-1, keepdims=True), v).reshape(n, d) @ w("attn_output").T
        x = _layernorm(x + o, w("attn_output_norm"), w("attn_output_norm", "bias"), eps)
        g = x @ w("ffn_gate").T
        y = (g / (1 + np.exp(-g)) * (x @ w("ffn_up").T)) @ w("ffn_down").T
        x = _layernorm(x + y, w("layer_output_norm"), w("layer_output_norm", "bias"), eps)
    return x


# ---- llama.cpp (--llama-python) -------------------------------------------------------------


def stage_llama(gguf_path: Path, out: Path) -> None:
    import llama_cpp
    from llama_cpp import Llama

    def load(s: dict, pooling: int) -> Llama:
        return Llama(
            model_path=str(gguf_path),
            embedding=True,
            n_ctx=s["n_ctx"],
            n_batch=s["n_batch"],
            n_ubatch=s["n_ubatch"],
            n_threads=s["n_threads"],
            n_threads_batch=s["n_threads"],
            flash_attn=s["flash_attn"],
            pooling_type=pooling,
            verbose=False,
        )

    def decode(llm: Llama, inputs: list[list[int]], per_token: bool) -> list[np.ndarray]:
        llm._batch.reset()
        for seq, ids in enumerate(inputs):
            llm._batch.add_sequence(ids, seq, True)
        llm._ctx.decode(llm._batch)
        n = llm.n_embd()
        if per_token:
            rows = [
                np.array(llama_cpp.llama_get_embeddings_ith(llm._ctx.ctx, i)[:n], np.float32)
                for i in range(sum(len(ids) for ids in inputs))
            ]
            bounds = np.cumsum([0] + [len(ids) for ids in inputs])
            return [np.stack(rows[bounds[s] : bounds[s + 1]]) for s in range(len(inputs))]
        return [
            np.array(llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, s)[:n], np.float32) for s in range(len(inputs))
        ]

    first = load(BASE, llama_cpp.LLAMA_POOLING_TYPE_MEAN)
    assert first.pooling_type() == llama_cpp.LLAMA_POOLING_TYPE_MEAN, first.pooling_type()  # the file's
    ids = [first.tokenize(text.encode("utf-8"), add_bos=True, special=False) for text in TEXTS]
    first.close()
    assert max(len(x) for x in ids) <= CONTEXT_LENGTH, [len(x) for x in ids]
    longest = int(np.argmax([len(x) for x in ids]))
    results = {}
    for name, over in SETTINGS.items():
        s = {**BASE, **over}
        for pooling, per_token in (
            (llama_cpp.LLAMA_POOLING_TYPE_MEAN, False),
            (llama_cpp.LLAMA_POOLING_TYPE_NONE, True),
        ):
            llm = load(s, pooling)
            if s["batch"] == BASE["batch"]:
                rows = [decode(llm, [x], per_token)[0] for x in ids]
            else:
                short = [i for i in range(len(ids)) if i != longest]
                rows = [None] * len(ids)
                for i, r in zip(short, decode(llm, [ids[i] for i in short], per_token)):
                    rows[i] = r
                rows[longest] = decode(llm, [ids[longest]], per_token)[0]
            llm.close()
            results[f"{name}/{'tokens' if per_token else 'pooled'}"] = (
                np.concatenate(rows) if per_token else np.stack(rows)
            )
    offsets = np.cumsum([0] + [len(x) for x in ids]).astype(np.int32)
    results["ids"] = np.array([t for x in ids for t in x], np.int32)
    results["offsets"] = offsets
    np.savez(out, **results)
    Path(str(out) + ".json").write_text(json.dumps({"llama_cpp_python": llama_cpp.__version__}))


# ---- main (project venv) --------------------------------------------------------------------


def figures(results: dict[str, np.ndarray], exact: dict[str, np.ndarray]) -> dict:
    rnd = lambda x: round(float(x), 8)  # noqa: E731
    names = list(SETTINGS)

    def spread(kind: str) -> dict:
        pairs = [(a, b) for a in names for b in names if a < b]
        return {
            "min_pairwise_cosine": rnd(
                min(cosines(results[f"{a}/{kind}"], results[f"{b}/{kind}"]).min() for a, b in pairs)
            ),
            "max_pairwise_abs_diff": rnd(
                max(np.abs(results[f"{a}/{kind}"] - results[f"{b}/{kind}"]).max() for a, b in pairs)
            ),
        }

    return {
        "llama_spread_pooled": spread("pooled"),
        "llama_spread_tokens": spread("tokens"),
        "min_cosine_vs_exact_float64": {n: rnd(cosines(results[f"{n}/pooled"], exact["pooled"]).min()) for n in names},
        "max_abs_diff_vs_exact_float64": {
            n: rnd(np.abs(results[f"{n}/pooled"] - exact["pooled"]).max()) for n in names
        },
        "min_token_cosine_vs_exact_float64": {
            n: rnd(cosines(results[f"{n}/tokens"], exact["tokens"]).min()) for n in names
        },
        "exact_without_rope_vs_base": {
            "min_cosine_pooled": rnd(cosines(exact["no_rope"], results["base/pooled"]).min()),
            "max_abs_diff_pooled": rnd(np.abs(exact["no_rope"] - results["base/pooled"]).max()),
        },
        "pooled_norms_base": [rnd(x) for x in np.linalg.norm(results["base/pooled"].astype(np.float64), axis=1)],
    }


def run_model(key: str, tmp: Path, llama_python: str) -> tuple[dict, dict[str, np.ndarray]]:
    sys.path.insert(0, str(ROOT / "tests"))
    from nomic_bert_factory import write_tiny_nomic_bert

    path = tmp / f"{key}.gguf"
    info = write_tiny_nomic_bert(path, **factory_kwargs(key))
    out = tmp / f"{key}.npz"
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
    subprocess.run(
        [llama_python, str(Path(__file__).resolve()), "--stage", "llama", "--gguf", str(path), "--out", str(out)],
        check=True,
        env=env,
    )
    results = dict(np.load(out))
    versions = json.loads(Path(str(out) + ".json").read_text())
    ids, offsets = results.pop("ids"), results.pop("offsets")
    inputs = [ids[offsets[i] : offsets[i + 1]].tolist() for i in range(len(TEXTS))]
    tokens = [exact_tokens(info, x) for x in inputs]
    exact = {
        "tokens": np.concatenate(tokens),
        "pooled": np.stack([t.mean(0) for t in tokens]),
        "no_rope": np.stack([exact_tokens(info, x, rope=False).mean(0) for x in inputs]),
    }
    arrays = {
        f"{key}/ids": ids,
        f"{key}/offsets": offsets,
        f"{key}/exact/pooled": exact["pooled"],
        f"{key}/exact_no_rope/pooled": exact["no_rope"],
    }
    if "rope_scaling" not in MODELS[key]:  # per-token states of the three types only, to keep the file small
        arrays[f"{key}/base/tokens"] = results["base/tokens"]
    arrays.update({f"{key}/{name}": a for name, a in results.items() if name.endswith("/pooled")})
    config = {
        k: info[k]
        for k in (
            "n_layers",
            "dim",
            "n_heads",
            "head_dim",
            "ffn_dim",
            "context_length",
            "rope_theta",
            "rope_scaling",
            "norm_eps",
            "vocab_size",
        )
    }
    model = {
        "key": key,
        "factory_kwargs": factory_kwargs(key),
        "sha256": sha256(path),
        "file_size": path.stat().st_size,
        "config": config,
        "n_tokens": [len(x) for x in inputs],
        "figures": figures(results, exact),
        "llama_cpp_python": versions["llama_cpp_python"],
    }
    return model, arrays


def main_stage(args) -> None:
    models, arrays = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for key in MODELS:
            model, model_arrays = run_model(key, Path(tmp), args.llama_python)
            models.append(model)
            arrays.update(model_arrays)
            fig = model["figures"]
            print(
                f"{model['key']:16s} {model['sha256'][:12]} tokens {model['n_tokens']} spread "
                f"{fig['llama_spread_pooled']} vs exact {fig['min_cosine_vs_exact_float64']} "
                f"no rope {fig['exact_without_rope_vs_base']}"
            )
    fixture = {
        "description": "llama.cpp (llama-cpp-python) embeddings of tiny random nomic-bert GGUFs written by "
        "tests/nomic_bert_factory.py write_tiny_nomic_bert; see scripts/make_nomic_bert_reference.py",
        "llama_cpp_python_version": models[0]["llama_cpp_python"],
        "gguf_version": importlib.metadata.version("gguf"),
        "numpy_version": np.__version__,
        "regenerate": ".venv/bin/python scripts/make_nomic_bert_reference.py --llama-python "
        "<venv with llama-cpp-python>/bin/python",
        "pooling": "pooled: MEAN (the file's pooling_type 1), llama_get_embeddings_seq, unnormalized; tokens: "
        "pooling NONE, llama_get_embeddings_ith of every token (its final hidden state)",
        "llama_cpp_calls": "Llama(path, embedding=True, n_ctx, n_batch, n_ubatch, n_threads, n_threads_batch, "
        "flash_attn, pooling_type); tokenize(text, add_bos=True, special=False); "
        "batch.add_sequence(ids, seq_id, True); decode(batch)",
        "base_settings": BASE,
        "settings": SETTINGS,
        "texts": TEXTS,
        "arrays": f"{OUT.with_suffix('.npz').name}: '<key>/ids', '<key>/offsets' (ragged llama.cpp token ids); "
        "'<key>/<setting>/pooled' float32 (n_texts, dim), '<key>/base/tokens' float32 "
        "(total tokens, dim); '<key>/exact/pooled' float64 reference; "
        "'<key>/exact_no_rope/pooled' the float64 pass without RoPE",
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
