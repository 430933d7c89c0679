"""llama.cpp's token ids, last-position top-5 logits and greedy text for gemma3-270m on ~40 prompts.

Run from the repository root with the environment that has llama-cpp-python
(CPU only, a few minutes on 2 busy cores), after ``miro models pull gemma3-270m``:

    /path/to/venv-with-llama-cpp/bin/python scripts/make_gemma3_reference.py \
        [--model PATH] [--out tests/fixtures/gemma3_llamacpp.json]

Without --model it reads gemma-3-270m-q4_k_m.gguf from the miro model cache
($MIRO_HOME/models, default ~/.cache/miro/models). The model is the base model
(no chat template), so the prompts are plain text: the last user message of each
of tests/fixtures/chat_prompts.json as "Question: ...\\nAnswer:" (20) and
CORPUS_INDICES of tests/fixtures/tokenizer_corpus.json (prose, code, markdown: 20).

For each prompt it records (model loaded with SETTINGS: f32 KV cache, no flash
attention), with no machine paths:

* ``ids``: ``tokenize(text, add_bos=True, special=False)`` (BOS = 2 first, as
  llama.cpp adds it for this file);
* ``top5_ids``/``top5_logits``: the logits of the last prompt position after
  evaluating ``ids`` in one batch, the 5 largest (descending; ties by lower id);
* ``greedy_ids``: 32 tokens from llama.cpp's greedy sampler, one decode step each;
  end-of-generation tokens do not stop it (``first_eog_index`` says where the
  first one is, or null), ``greedy_text`` their detokenized text, and
  ``greedy_margins`` the top-1 minus top-2 logit gap of each step (a
  reimplementation may pick the other token where this gap is within its noise).

Then it runs llama.cpp again under each of OTHER_SETTINGS (flash attention on, an
f16 KV cache, one token per batch) and records in ``llama_cpp_self_agreement`` how
closely llama.cpp follows its own reference: prompts whose top-1 is equal, greedy
continuations equal, and the mean absolute difference of the reference's top-5
logits. That is the yardstick for how closely a reimplementation can follow it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import llama_cpp
import numpy as np
from model_cache import cached_model

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"
CORPUS_INDICES = [2, 3, 4, 5, 6, 15, 16, 18, 32, 33, 34, 36, 38, 40, 45, 49, 53, 107, 190, 193]
N_NEW = 32
TOP_K = 5
SETTINGS = {
    "n_ctx": 512,
    "n_batch": 512,
    "n_threads": 2,
    "logits_all": False,
    "flash_attn": False,
    "type_k": "f32",
    "type_v": "f32",
}
# llama.cpp's own ways of running the same model, each as reasonable as SETTINGS: how far llama.cpp moves
# from its own reference under them is the yardstick for miro's distance from it.
OTHER_SETTINGS = {
    "flash_attn": {"flash_attn": True},
    "f16_kv_cache": {"type_k": "f16", "type_v": "f16"},
    "one_token_per_batch": {"n_batch": 1, "n_ubatch": 1},
}


def prompts() -> list[dict]:
    chats = json.loads((FIXTURES / "chat_prompts.json").read_text(encoding="utf-8"))
    corpus = json.loads((FIXTURES / "tokenizer_corpus.json").read_text(encoding="utf-8"))
    out = []
    for i, chat in enumerate(chats):
        question = [m["content"] for m in chat["messages"] if m["role"] == "user"][-1]
        out.append({"source": f"chat_prompts.json[{i}]", "text": f"Question: {question}\nAnswer:"})
    for i in CORPUS_INDICES:
        out.append({"source": f"tokenizer_corpus.json[{i}]", "text": corpus[i]})
    return out


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def last_logits(llm: llama_cpp.Llama) -> np.ndarray:
    """Float32 logits of the last evaluated position (llm.scores is not filled without logits_all)."""
    ptr = llm._ctx.get_logits_ith(-1)
    return np.array(np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)), dtype=np.float32, copy=True)


def top(logits: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-logits, kind="stable")[:k]


def open_model(model: Path, settings: dict) -> llama_cpp.Llama:
    kv_type = {"f32": llama_cpp.GGML_TYPE_F32, "f16": llama_cpp.GGML_TYPE_F16}
    return llama_cpp.Llama(
        model_path=str(model),
        n_ctx=settings["n_ctx"],
        n_batch=settings["n_batch"],
        n_ubatch=settings.get("n_ubatch", settings["n_batch"]),
        n_threads=settings["n_threads"],
        logits_all=False,
        flash_attn=settings["flash_attn"],
        type_k=kv_type[settings["type_k"]],
        type_v=kv_type[settings["type_v"]],
        verbose=False,
    )


def reference(llm: llama_cpp.Llama, prompt: dict, eog: list[int]) -> dict:
    """One prompt's ids, last-position top-5 and greedy continuation under llm's settings."""
    ids = list(llm.tokenize(prompt["text"].encode("utf-8"), add_bos=True, special=False))
    llm.reset()
    llm.eval(ids)
    logits = last_logits(llm)
    best = top(logits, TOP_K)
    greedy, margins = [], []
    cur = logits
    for step in range(N_NEW):
        token = int(llm.sample(temp=0.0, repeat_penalty=1.0))
        assert token == int(np.argmax(cur)), "llama.cpp's greedy token is not the argmax"
        two = np.sort(cur)[-2:]
        greedy.append(token)
        margins.append(round(float(two[1] - two[0]), 5))
        if step < N_NEW - 1:
            llm.eval([token])
            cur = last_logits(llm)
    first_eog = next((k for k, t in enumerate(greedy) if t in eog), None)
    text = llm.detokenize(greedy, special=True).decode("utf-8", errors="replace")
    return {
        **prompt,
        "ids": ids,
        "top5_ids": [int(t) for t in best],
        "top5_logits": [float(logits[t]) for t in best],
        "top5_all_logits": logits,
        "greedy_ids": greedy,
        "greedy_text": text,
        "greedy_margins": margins,
        "first_eog_index": first_eog,
    }


def agreement(base: list[dict], other: list[dict]) -> dict:
    """How closely a run under other settings follows the base run, in the measures the tests use."""
    diffs = [
        abs(float(o["top5_all_logits"][t]) - float(b["top5_all_logits"][t]))
        for b, o in zip(base, other)
        for t in b["top5_ids"]
    ]
    return {
        "top1_equal": sum(b["top5_ids"][0] == o["top5_ids"][0] for b, o in zip(base, other)),
        "greedy_equal": sum(b["greedy_ids"] == o["greedy_ids"] for b, o in zip(base, other)),
        "top5_mean_abs_diff": round(float(np.mean(diffs)), 5),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help=f"the GGUF (default: {MODEL_FILE} in the miro cache)")
    parser.add_argument("--out", type=Path, default=FIXTURES / "gemma3_llamacpp.json")
    args = parser.parse_args()
    model = args.model or cached_model("gemma3-270m")

    llm = open_model(model, SETTINGS)
    vocab = llm._model.vocab
    eog = [t for t in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, t)]
    records = []
    for p in prompts():
        records.append(reference(llm, p, eog))
        r = records[-1]
        print(
            f"{len(r['ids']):3d} tokens  top1 {r['top5_ids'][0]:6d}  min margin {min(r['greedy_margins']):.4f}  "
            f"{r['greedy_text'][:50]!r}"
        )
    self_agreement = {}
    for name, change in OTHER_SETTINGS.items():
        other = open_model(model, SETTINGS | change)
        self_agreement[name] = {"settings": change} | agreement(records, [reference(other, p, eog) for p in prompts()])
        print(f"llama.cpp with {name}: {self_agreement[name]}")
        del other

    fixture = {
        "description": "gemma3-270m (Q4_K_M, base model) reference from llama.cpp via llama-cpp-python (CPU); "
        "see scripts/make_gemma3_reference.py",
        "model": model.name,
        "model_sha256": sha256(model),
        "llama_cpp_python_version": llama_cpp.__version__,
        "settings": SETTINGS,
        "bos_id": llm.token_bos(),
        "eos_id": llm.token_eos(),
        "eog_ids": eog,
        "tokenize": "tokenize(text, add_bos=True, special=False)",
        "top_k": TOP_K,
        "n_new_tokens": N_NEW,
        "greedy": "llama.cpp's greedy sampler (Llama.sample(temp=0)) after the prompt batch, one token per decode "
        "step; end-of-generation tokens do not stop it",
        "llama_cpp_self_agreement": self_agreement,
        "prompts": [{k: v for k, v in r.items() if k != "top5_all_logits"} for r in records],
    }
    args.out.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(records)} prompts to {args.out}")


if __name__ == "__main__":
    main()
