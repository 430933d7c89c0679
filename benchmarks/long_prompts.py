"""Long documents, short answers: prompts of 1-4k tokens and a few output tokens (classification, extraction),
where prefill is the whole cost; miro's engine against llama.cpp's batched API, each in its own process, in turn.

    python benchmarks/long_prompts.py [--model smollm2-135m | PATH.gguf] [--docs 8] [--prompt-tokens 1000,4000]
                                      [--new-tokens 4] [--rounds 3] [--threads N] [--engines miro,llama.cpp]
                                      [--llama-python VENV/bin/python] [--tier avx2]

The prompts: --docs documents of random token ids (ids 100 to vocab - 1: no control tokens), their lengths spread
evenly over the --prompt-tokens range, the same ids for both engines; greedy, ignore EOS, --new-tokens each.
The Llama-3.2-1B-shaped Q4_K_M file: `python benchmarks/tinyllama.py --shape llama3.2-1b --quant Q4_K_M` writes it
to ~/.cache/miro/bench/ (give its path as --model).
- miro: Engine.from_model(path) with its defaults (weights, chunked prefill, max_num_batched_tokens, admission) and
  a KV cache holding every document at once, as llama.cpp's context below; a warm-up of the same shapes first
  (numba's kernels), then the timed generate. Its step is taken apart as step_time.py does (GEMMs, attention,
  sampler, the rest), and its steps counted: what limits its prefill.
- llama.cpp: tinyllama.py's batched low-level API (all documents' tokens in chunks of n_batch = 512 per
  llama_decode, flash attention, one sequence per document, greedy on its logits).
Prints prompt tokens/s per engine per round, miro / llama.cpp round by round and their median. The machine's load
average is printed: on a shared machine the ratios are what count.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

import tiers
from step_time import PartTimer
from tinyllama import LLAMA_CPP_SCRIPT, child_result


def documents(n_docs: int, shortest: int, longest: int, vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(7)
    lengths = np.linspace(shortest, longest, n_docs).round().astype(int)
    return [rng.integers(100, vocab - 1, size=int(n)).tolist() for n in lengths]


def run_miro(path: str, docs: list[list[int]], new_tokens: int, threads: int) -> dict:
    from miro.cli.common import limit_threads
    from miro.core import Engine, SamplingParams

    limit_threads(threads)
    block_size = 16
    blocks = sum(-(-(len(d) + new_tokens) // block_size) for d in docs) + len(docs)
    t0 = time.perf_counter()
    engine = Engine.from_model(path, block_size=block_size, num_kv_blocks=blocks, max_num_seqs=len(docs))
    load_s = time.perf_counter() - t0
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    warm = [[100 + (t + 1) % 1000 for t in d] for d in docs]  # the same shapes, nothing the prefix cache can reuse
    engine.generate(warm, params, use_tqdm=False)
    timer = PartTimer()
    timer.wrap_linear()
    timer.wrap_sampler()
    timer.wrap_attention(engine.config)
    timer.active = True
    steps = 0
    t0 = time.perf_counter()
    for i, doc in enumerate(docs):
        engine.add_request(doc, params, request_id=f"doc{i}")
    generated = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                generated += len(out.outputs[0].token_ids)
        steps += 1
    run_s = time.perf_counter() - t0
    timer.active = False
    parts = dict(timer.seconds)
    parts["rest"] = run_s - sum(parts.values())
    return dict(
        load_s=load_s,
        run_s=run_s,
        prompt_tokens=sum(map(len, docs)),
        generated=generated,
        steps=steps,
        parts=parts,
        weights=engine.weight_format,
        max_batched=engine.scheduler.max_num_batched_tokens,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--docs", type=int, default=8)
    parser.add_argument("--prompt-tokens", default="1000,4000", help="shortest,longest document")
    parser.add_argument("--new-tokens", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--engines", default="miro,llama.cpp")
    parser.add_argument("--llama-python", default=os.environ.get("LLAMA_PYTHON"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    tiers.add_argument(parser)
    args = parser.parse_args()
    from miro.core.loading.gguf_file import GGUFFile
    from miro.core.loading.registry import resolve_model

    path = str(resolve_model(args.model))
    shortest, longest = map(int, args.prompt_tokens.split(","))
    vocab = len(GGUFFile(path).metadata["tokenizer.ggml.tokens"])
    docs = documents(args.docs, shortest, longest, vocab)
    if args.child:
        print(json.dumps(run_miro(path, docs, args.new_tokens, args.threads)))
        return
    tiers.enter(args)  # the child processes inherit the emulation's environment
    print(tiers.header(args, args.llama_python, with_llama="llama.cpp" in args.engines.split(",")), flush=True)
    print(
        f"{os.path.basename(path)}: {args.docs} documents of {shortest}-{longest} tokens "
        f"({sum(map(len, docs)):,} in all), {args.new_tokens} new tokens each, {args.threads} threads; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    ratios = []
    for _ in range(args.rounds):
        rates = {}
        for name in args.engines.split(","):
            if name == "llama.cpp":
                if not args.llama_python:
                    print("  llama.cpp: skipped (no --llama-python)")
                    continue
                cmd = [
                    args.llama_python,
                    "-c",
                    LLAMA_CPP_SCRIPT,
                    path,
                    json.dumps(docs),
                    str(args.new_tokens),
                    str(args.threads),
                ]
            else:
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    "1",
                    "--model",
                    path,
                    "--docs",
                    str(args.docs),
                    "--prompt-tokens",
                    args.prompt_tokens,
                    "--new-tokens",
                    str(args.new_tokens),
                    "--threads",
                    str(args.threads),
                ]
            r = child_result(cmd)
            prompt_tokens = sum(map(len, docs))
            rates[name] = prompt_tokens / r["run_s"]
            line = (
                f"{name:>10}: {rates[name]:7.1f} prompt tok/s ({prompt_tokens:,} prompt tokens + "
                f"{len(docs) * args.new_tokens} new in {r['run_s']:.1f} s), peak RSS {r['peak_rss'] / 2**20:,.0f} MiB"
            )
            if "parts" in r:
                parts = ", ".join(
                    f"{k} {v / r['run_s']:.0%}" for k, v in sorted(r["parts"].items(), key=lambda kv: -kv[1])
                )
                line += (
                    f"\n{'':>12}weights {r['weights']}, {r['steps']} steps of up to {r['max_batched']} tokens; "
                    f"time: {parts}"
                )
            print(line, flush=True)
        if len(rates) == 2:
            ratios.append(rates["miro"] / rates["llama.cpp"])
    if ratios:
        print(
            f"miro / llama.cpp prompt tok/s, round by round: {', '.join(f'{x:.2f}x' for x in ratios)}; "
            f"median {float(np.median(ratios)):.2f}x; load average {os.getloadavg()[0]:.2f}"
        )


if __name__ == "__main__":
    main()
