"""Reference logits and greedy text for the default model, from llama.cpp (llama-cpp-python).

Run (from the repository root, after ``scripts/make_hf_reference.py``, with the
environment that has llama-cpp-python; CPU only, under a minute):

    python scripts/make_llamacpp_reference.py \
        [--model PATH]   # default: smollm2-135m from the miro model cache, pulled if needed

It reads ``tests/fixtures/hf_reference.json`` (the 20 rendered chat prompts and
HF's token ids) and writes ``tests/fixtures/llamacpp_reference.json``: the
llama_cpp version, and per prompt:

* ``tokenize_ids``: ``llm.tokenize(prompt_text.encode(), add_bos=False,
  special=True)`` and ``tokenize_matches_hf`` (whether they equal HF's ids);
* ``top1_id``, ``top20_ids``, ``top20_logits``: the last-position logits after
  evaluating HF's prompt ids (so the logits compare like for like even if the
  tokenizers disagree), plus ``logits_at_hf_top20`` (llama.cpp's logits at
  HF's top-20 ids, in HF's order);
* ``greedy_ids`` / ``greedy_text``: a 32-token greedy continuation with EOS
  ignored, done by hand: ``llm.eval`` one token at a time, the EOS logits set
  to -inf, argmax (ties to the lowest id, as numpy's argmax).

It also writes a ``comparison`` section against HF (top-1 agreement, max abs
difference of the top-20 logits, greedy agreement, tokenization agreement).
The context is ``Llama(model_path, n_ctx=2048, logits_all=False, n_threads=2,
verbose=False)``, reset before each prompt.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
from pathlib import Path

import numpy as np
from model_cache import cached_model

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
N_NEW = 32
TOP_K = 20


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def last_logits(llm) -> np.ndarray:
    """Float32 logits of the last evaluated position.

    With ``logits_all=False`` llama-cpp-python 0.3.x no longer copies logits into
    ``llm.scores`` (it is left zero), so read them from the context directly:
    ``llama_get_logits_ith(ctx, -1)`` is the last output row of the last decode.
    """
    n_vocab = llm.n_vocab()
    ptr = llm._ctx.get_logits_ith(-1)
    return np.array(np.ctypeslib.as_array(ptr, shape=(n_vocab,)), dtype=np.float32, copy=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--hf", default=str(FIXTURES / "hf_reference.json"))
    ap.add_argument("--out", default=str(FIXTURES / "llamacpp_reference.json"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    args.model = args.model or cached_model()

    import llama_cpp
    from llama_cpp import Llama

    model_path = os.path.abspath(args.model)
    hf = json.loads(Path(args.hf).read_text())
    eos_ids = hf["greedy"]["eos_masked_ids"]
    llm = Llama(model_path=model_path, n_ctx=2048, logits_all=False, n_threads=args.threads, verbose=False)
    assert llm.n_vocab() == hf["config"]["vocab_size"], llm.n_vocab()
    assert llm.token_eos() in eos_ids, llm.token_eos()

    records = []
    for p in hf["prompts"]:
        i = p["index"]
        text = p["prompt_text"]
        hf_ids = p["prompt_ids"]
        tok_ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)

        llm.reset()
        llm.eval(hf_ids)
        logits = last_logits(llm)
        top = np.argsort(-logits, kind="stable")[:TOP_K]

        greedy: list[int] = []
        cur = logits
        for _ in range(N_NEW):
            masked = cur.copy()
            masked[eos_ids] = -np.inf
            nxt = int(np.argmax(masked))
            greedy.append(nxt)
            llm.eval([nxt])
            cur = last_logits(llm)
        greedy_text = llm.detokenize(greedy, special=True).decode("utf-8", errors="replace")

        records.append(
            {
                "index": i,
                "n_prompt_tokens": len(hf_ids),
                "tokenize_ids": tok_ids,
                "tokenize_matches_hf": tok_ids == hf_ids,
                "top1_id": int(top[0]),
                "top20_ids": [int(t) for t in top],
                "top20_logits": [float(logits[t]) for t in top],
                "logits_at_hf_top20": [float(logits[t]) for t in p["top20_ids"]],
                "greedy_ids": greedy,
                "greedy_text": greedy_text,
            }
        )
        print(f"{i:2d} tok_match={tok_ids == hf_ids} top1={int(top[0]):5d} hf={p['top1_id']:5d} {greedy_text[:60]!r}")

    # Comparison with HF.
    top1_agree = sum(r["top1_id"] == p["top1_id"] for r, p in zip(records, hf["prompts"]))
    diffs = [
        float(np.max(np.abs(np.array(r["logits_at_hf_top20"]) - np.array(p["top20_logits"]))))
        for r, p in zip(records, hf["prompts"])
    ]
    greedy_agree = [r["greedy_ids"] == p["greedy_ids"] for r, p in zip(records, hf["prompts"])]
    common_prefix = []
    for r, p in zip(records, hf["prompts"]):
        n = 0
        while n < N_NEW and r["greedy_ids"][n] == p["greedy_ids"][n]:
            n += 1
        common_prefix.append(n)
    comparison = {
        "top1_agree": top1_agree,
        "n_prompts": len(records),
        "max_abs_diff_top20_logits": max(diffs),
        "max_abs_diff_top20_logits_per_prompt": diffs,
        "greedy_full_agree": sum(greedy_agree),
        "greedy_common_prefix_len": common_prefix,
        "tokenize_matches_hf_all": all(r["tokenize_matches_hf"] for r in records),
        "tokenize_mismatch_indices": [r["index"] for r in records if not r["tokenize_matches_hf"]],
    }
    print(json.dumps(comparison))

    result = {
        "description": "SmolLM2-135M-Instruct Q4_1 reference from llama.cpp via llama-cpp-python (CPU); "
        "see scripts/make_llamacpp_reference.py",
        "model": os.path.basename(model_path),  # the file name only: no machine path in a committed fixture
        "model_sha256": sha256(model_path),
        "versions": {
            "python": platform.python_version(),
            "llama_cpp_python": llama_cpp.__version__,
            "numpy": np.__version__,
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
        },
        "llama_params": {"n_ctx": 2048, "logits_all": False, "n_threads": args.threads},
        "prompt_ids_source": "hf_reference.json prompt_ids",
        "greedy": {
            "max_new_tokens": N_NEW,
            "eos_masked_ids": eos_ids,
            "method": "llm.eval one token at a time, EOS -> -inf, numpy argmax",
        },
        "top_k": TOP_K,
        "comparison_with_hf": comparison,
        "prompts": records,
    }
    Path(args.out).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
