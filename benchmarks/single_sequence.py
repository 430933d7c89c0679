"""Single-sequence load time, prefill tokens/s and decode tokens/s: miro against llama-cpp-python.

    python benchmarks/single_sequence.py [--llama-python /path/to/venv/bin/python]

miro runs in this process. llama-cpp-python runs in this process when it is
importable, else under --llama-python (a venv that has it), on the same
prompts (the 20 chat prompts of tests/fixtures/hf_reference.json) and the
same number of decode tokens. Prints each side's figures and the ratios.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = json.loads((ROOT / "tests/fixtures/hf_reference.json").read_text())["prompts"]


def bench_miro(model: str, decode_tokens: int) -> dict:
    from miro.core import Engine, SamplingParams
    from miro.core.loading.registry import resolve_model

    path = resolve_model(model)
    t0 = time.perf_counter()
    engine = Engine.from_model(path, max_model_len=2048)
    load_s = time.perf_counter() - t0
    engine.logits(PROMPTS[0]["prompt_ids"])  # compile / warm up
    engine.generate([PROMPTS[0]["prompt_ids"]], SamplingParams(max_tokens=2, temperature=0))
    prefill_tokens = prefill_s = decode_s = 0.0
    for p in PROMPTS:
        t0 = time.perf_counter()
        engine.logits(p["prompt_ids"])
        prefill_s += time.perf_counter() - t0
        prefill_tokens += len(p["prompt_ids"])
        t0 = time.perf_counter()
        engine.generate([p["prompt_ids"]], SamplingParams(max_tokens=decode_tokens, temperature=0, ignore_eos=True))
        decode_s += time.perf_counter() - t0
    decode_s -= prefill_s  # generate() prefilled again
    return dict(
        load_s=load_s, prefill_tok_s=prefill_tokens / prefill_s, decode_tok_s=decode_tokens * len(PROMPTS) / decode_s
    )


def bench_llama_cpp(model_path: str, decode_tokens: int) -> dict:
    from llama_cpp import Llama

    t0 = time.perf_counter()
    llm = Llama(model_path=model_path, n_ctx=2048, n_threads=2, n_batch=512, verbose=False)
    load_s = time.perf_counter() - t0
    llm.eval(PROMPTS[0]["prompt_ids"])  # warm up
    prefill_tokens = prefill_s = decode_s = 0.0
    for p in PROMPTS:
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(p["prompt_ids"])
        prefill_s += time.perf_counter() - t0
        prefill_tokens += len(p["prompt_ids"])
        t0 = time.perf_counter()
        for _ in range(decode_tokens):
            token = llm.sample(temp=0.0)
            llm.eval([token])
        decode_s += time.perf_counter() - t0
    return dict(
        load_s=load_s, prefill_tok_s=prefill_tokens / prefill_s, decode_tok_s=decode_tokens * len(PROMPTS) / decode_s
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--llama-python", help="python of a venv with llama-cpp-python")
    parser.add_argument("--only-llama-cpp", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.only_llama_cpp:
        print(json.dumps(bench_llama_cpp(args.model, args.decode_tokens)))
        return

    from miro.core.loading.registry import resolve_model

    model_path = str(resolve_model(args.model))
    results = {"miro": bench_miro(args.model, args.decode_tokens)}
    try:
        results["llama-cpp-python"] = bench_llama_cpp(model_path, args.decode_tokens)
    except ImportError:
        if args.llama_python:
            cmd = [
                args.llama_python,
                __file__,
                "--only-llama-cpp",
                "--model",
                model_path,
                "--decode-tokens",
                str(args.decode_tokens),
            ]
            results["llama-cpp-python"] = json.loads(
                subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            )
    for name, r in results.items():
        print(
            f"{name:<17} load {r['load_s']:.2f} s   prefill {r['prefill_tok_s']:7.1f} tok/s   "
            f"decode (1 sequence) {r['decode_tok_s']:6.1f} tok/s"
        )
    if len(results) == 2:
        m, lc = results["miro"], results["llama-cpp-python"]
        print(
            f"miro / llama-cpp-python: prefill {m['prefill_tok_s'] / lc['prefill_tok_s']:.2f}x, "
            f"decode {m['decode_tok_s'] / lc['decode_tok_s']:.2f}x"
        )


if __name__ == "__main__":
    main()
