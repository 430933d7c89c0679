"""miro native, miro f32 and llama.cpp's batched API on a TinyLlama-1.1B-, Llama-3.2-1B-, Llama-3.2-3B- or
Qwen2.5-1.5B-shaped model with random weights.

    python benchmarks/tinyllama.py --llama-python VENV/bin/python
                                   [--shape tinyllama|llama3.2-1b|llama3.2-3b|qwen2.5-1.5b]
                                   [--quant Q4_0|Q4_K_M|Q8_0] [--seqs 8] [--prompt-tokens 32] [--new-tokens 16]
                                   [--rounds 1] [--engines native,llama.cpp,f32] [--tier avx2]

The model (--shape), a llama unless named otherwise:
- tinyllama: dim 2048, 22 layers, 32/4 heads, FFN 5632, vocab 32000, separate head;
- llama3.2-1b: dim 2048, 16 layers, 32/8 heads, FFN 8192, vocab 128256, the head tied to the embedding, RoPE base
  500000 and Llama 3's frequency factors (rope_freqs.weight, factor 32 over 8192 positions);
- llama3.2-3b: llama3.2-1b's with dim 3072, 28 layers, 24/8 heads (head_dim 128);
- qwen2.5-1.5b: llama.cpp's qwen2 architecture, dim 1536, 28 layers, 12/2 heads (head_dim 128), FFN 8960, vocab
  151936, the head tied, RoPE base 1000000 (NEOX), RMS eps 1e-6, F32 biases on Q, K and V (0.5 N(0, 1)).
Norms 1. The vocabulary is the tests' byte-level BPE padded to the shape's size (the prompts are token ids).
--quant picks its weights:
- Q4_0 (default): every matrix random Q4_0 blocks (about 0.6 GB for tinyllama), written into a temp folder each
  run;
- Q4_K_M, Q8_0: the same model written with random F16 matrices (uniform, the Q4_0 blocks' range and spread),
  then quantized by llama.cpp's own llama_model_quantize(LLAMA_FTYPE_MOSTLY_Q4_K_M or _Q8_0) under
  --llama-python: its recipe (Q4_K_M: Q4_K for most matrices, Q6_K for the output head, or the tied embedding,
  and some attn_v / ffn_down; Q8_0: every matrix). The F16 file (2.2 GB for tinyllama, 6.4 GB for llama3.2-3b)
  is deleted once quantized; the result is kept in ~/.cache/miro/bench/, named by the shape, seed and quant, for
  later runs.
The file's tensor type mix is printed. Each engine then runs in its own process on the same token-id prompts,
all sequences at once, greedy, EOS ignored, and reports load time, its own peak RSS and total tokens/s
(prompt + generated over the run, load excluded), then how many sequences' greedy tokens each miro engine shares
with llama.cpp's (random weights leave near-ties: a late divergence is rounding, not a wrong layer). f32 holds
every weight as float32 (12.8 GB for llama3.2-3b): leave it out of --engines where memory is short.
--rounds N runs the engines in turn N times and prints native / llama.cpp round by round and the median: this
machine's speed drifts between minutes.
miro's KV cache holds the blocks the run needs, as llama.cpp's context is sized to the run.
llama.cpp runs through llama-cpp-python's low-level API, in the interpreter given by --llama-python (or $LLAMA_PYTHON):
one llama_batch holding every sequence, flash attention on, as llama.cpp's examples/parallel does.

--tier avx2 runs miro under the AVX2 tier's emulation (benchmarks/tiers.py): give it a llama.cpp built for AVX2.

The issue's targets for native: peak RSS <= file size x 1.3 + KV cache; load <= 1 s; throughput >= llama.cpp's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import tiers
from shaped_models import LLAMA_FTYPES, SHAPES, model_file, type_mix

ROOT = Path(__file__).resolve().parents[1]


def prompts(n_seqs: int, n_tokens: int) -> list[list[int]]:
    rng = np.random.default_rng(1)
    return [rng.integers(3, 259, size=n_tokens).tolist() for _ in range(n_seqs)]  # byte tokens: no control ids


def kv_cache_bytes(shape: str, n_seqs: int, n_tokens: int) -> int:
    """float32 K and V for every token of every sequence, all layers (what miro's cache needs at least)."""
    s = SHAPES[shape]
    return 2 * 4 * s["n_layers"] * s["n_kv_heads"] * (s["dim"] // s["n_heads"]) * n_seqs * n_tokens


# -- one engine per process ---------------------------------------------------------------------------


def run_miro(path: str, weights: str, seqs: list[list[int]], new_tokens: int, threads: int) -> dict:
    sys.path.insert(0, str(ROOT.parent))
    from miro.cli.common import limit_threads
    from miro.core import Engine, SamplingParams

    limit_threads(threads)
    t0 = time.perf_counter()
    # a KV cache of the blocks this run needs, as llama.cpp's context is sized to it (n_ctx below)
    block_size = 16
    blocks = len(seqs) * -(-(max(map(len, seqs)) + new_tokens) // block_size)
    engine = Engine.from_model(
        path, weights=weights, block_size=block_size, num_kv_blocks=blocks, max_num_seqs=len(seqs)
    )
    load_s = time.perf_counter() - t0
    # numba's kernels compile (or load from cache) outside the timing: a run of the same shape on other
    # prompts (so the prefix cache holds nothing the timed run can use)
    warm = [[3 + (t + 1) % 256 for t in s] for s in seqs]
    engine.generate(warm, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True), use_tqdm=False)
    t0 = time.perf_counter()
    outs = engine.generate(seqs, SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True), use_tqdm=False)
    run_s = time.perf_counter() - t0
    generated = [list(o.outputs[0].token_ids) for o in outs]
    return dict(
        load_s=load_s,
        run_s=run_s,
        tokens=sum(map(len, seqs)) + sum(map(len, generated)),
        weight_memory=engine.weight_memory,
        generated=generated,
    )


LLAMA_CPP_SCRIPT = r"""
import json, sys, time, ctypes
import numpy as np
import llama_cpp as l

path, seqs, new_tokens, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
l.llama_backend_init()
t0 = time.perf_counter()
mp = l.llama_model_default_params()
model = l.llama_model_load_from_file(path.encode(), mp)
cp = l.llama_context_default_params()
n_ctx = len(seqs) * (max(map(len, seqs)) + new_tokens + 8)
cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, 512, 512, len(seqs)
cp.n_threads = cp.n_threads_batch = threads
cp.flash_attn_type = l.LLAMA_FLASH_ATTN_TYPE_ENABLED
ctx = l.llama_init_from_model(model, cp)
load_s = time.perf_counter() - t0
n_vocab = l.llama_vocab_n_tokens(l.llama_model_get_vocab(model))
batch = l.llama_batch_init(512, 0, len(seqs))

def decode(items):  # items: (token, pos, seq, wants_logits); returns {seq: argmax}
    picks = {}
    for start in range(0, len(items), 512):
        chunk = items[start:start + 512]
        for i, (tok, pos, seq, want) in enumerate(chunk):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, want
        batch.n_tokens = len(chunk)
        assert l.llama_decode(ctx, batch) == 0
        for i, (tok, pos, seq, want) in enumerate(chunk):
            if want:
                row = np.ctypeslib.as_array(l.llama_get_logits_ith(ctx, i), shape=(n_vocab,))
                picks[seq] = int(row.argmax())
    return picks

decode([(seqs[0][i], i, 0, i == 3) for i in range(4)])  # warm-up outside the timing, as for miro
l.llama_memory_clear(l.llama_get_memory(ctx), True)
t0 = time.perf_counter()
items = [(t, p, s, p == len(ids) - 1) for s, ids in enumerate(seqs) for p, t in enumerate(ids)]
last = decode(items)
lengths = [len(ids) for ids in seqs]
generated = [[last[s]] for s in range(len(seqs))]
for step in range(new_tokens - 1):
    last = decode([(last[s], lengths[s] + step, s, True) for s in range(len(seqs))])
    for s in range(len(seqs)):
        generated[s].append(last[s])
run_s = time.perf_counter() - t0
tokens = sum(lengths) + sum(map(len, generated))
print(json.dumps(dict(load_s=load_s, run_s=run_s, tokens=tokens, generated=generated)))
"""


def child_result(cmd: list[str]) -> dict:
    """Run one engine in its own process; its JSON line plus that process's own peak RSS (wait4's rusage)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"{cmd[:3]} failed:\n{err.read()[-3000:]}")
        result = json.loads(out.read().strip().splitlines()[-1])
    result["peak_rss"] = usage.ru_maxrss * 1024
    return result


def print_ratios(runs: list[dict]) -> None:
    """native / llama.cpp tokens/s, round by round (each round runs both in turn), and their median."""
    ratios = sorted(
        r["native"]["tokens"] / r["native"]["run_s"] / (r["llama.cpp"]["tokens"] / r["llama.cpp"]["run_s"])
        for r in runs
        if "native" in r and "llama.cpp" in r
    )
    if ratios:
        print(
            f"native / llama.cpp tok/s, round by round: {', '.join(f'{x:.2f}x' for x in ratios)}; "
            f"median {ratios[len(ratios) // 2]:.2f}x",
            flush=True,
        )


def print_agreement(results: dict) -> None:
    """How many sequences' greedy tokens each miro engine shares with llama.cpp's, and where the others part."""
    if "llama.cpp" not in results:
        return
    theirs = results["llama.cpp"]["generated"]
    for name, r in results.items():
        if name == "llama.cpp":
            continue
        shared = []
        for ours, ref in zip(r["generated"], theirs):
            n = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
            shared.append(n)
        same = sum(n == len(ref) for n, ref in zip(shared, theirs))
        parted = sorted(n for n, ref in zip(shared, theirs) if n < len(ref))
        print(
            f"greedy tokens, {name} against llama.cpp: {same} of {len(theirs)} sequences identical"
            + (f"; the others part after {', '.join(map(str, parted))} tokens" if parted else ""),
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=tuple(SHAPES), default="tinyllama")
    parser.add_argument("--seqs", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--engines", default="native,llama.cpp,f32")
    parser.add_argument(
        "--quant",
        choices=("Q4_0", *LLAMA_FTYPES),
        default="Q4_0",
        help="Q4_0: random blocks; Q4_K_M, Q8_0: llama.cpp's quantizer on random F16 weights (cached)",
    )
    parser.add_argument(
        "--llama-python",
        default=os.environ.get("LLAMA_PYTHON"),
        help="A Python with llama-cpp-python installed (without it, llama.cpp is skipped).",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the engines in turn this many times; prints native / llama.cpp round by round",
    )
    parser.add_argument("--child", nargs=2, metavar=("WEIGHTS", "PATH"), help=argparse.SUPPRESS)
    tiers.add_argument(parser)
    args = parser.parse_args()
    seqs = prompts(args.seqs, args.prompt_tokens)
    if args.child:
        print(json.dumps(run_miro(args.child[1], args.child[0], seqs, args.new_tokens, args.threads)))
        return
    tiers.enter(args)  # the --child processes inherit the emulation's environment
    print(tiers.header(args, args.llama_python, with_llama="llama.cpp" in args.engines.split(",")), flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        path, origin = model_file(args.shape, args.quant, Path(tmp), args.llama_python, args.threads)
        size = path.stat().st_size
        print(f"{path.name}: {size / 2**20:,.0f} MiB ({origin}); tensor types: {type_mix(path)}", flush=True)
        print(
            f"{args.seqs} sequences x ({args.prompt_tokens} prompt + {args.new_tokens} new) tokens, "
            f"{args.threads} threads",
            flush=True,
        )
        runs = []
        for round_ in range(args.rounds):  # the engines in turn, one at a time, so that drift hits each alike
            results = {}
            for name in args.engines.split(","):
                if name == "llama.cpp" and not args.llama_python:
                    print("  llama.cpp: skipped (no --llama-python)", flush=True)
                    continue
                if name == "llama.cpp":
                    cmd = [
                        args.llama_python,
                        "-c",
                        LLAMA_CPP_SCRIPT,
                        str(path),
                        json.dumps(seqs),
                        str(args.new_tokens),
                        str(args.threads),
                    ]
                else:
                    cmd = [
                        sys.executable,
                        __file__,
                        "--child",
                        name,
                        str(path),
                        "--shape",
                        args.shape,
                        "--seqs",
                        str(args.seqs),
                        "--prompt-tokens",
                        str(args.prompt_tokens),
                        "--new-tokens",
                        str(args.new_tokens),
                        "--threads",
                        str(args.threads),
                    ]
                results[name] = r = child_result(cmd)
                print(
                    f"{name:>10}: load {r['load_s']:6.2f} s  peak RSS {r['peak_rss'] / 2**20:>8,.0f} MiB  "
                    f"{r['tokens'] / r['run_s']:7.1f} tok/s ({r['tokens']} tokens in {r['run_s']:.1f} s)",
                    flush=True,
                )
            runs.append(results)
        print_agreement(runs[0] if runs else {})
        print_ratios(runs)
        if "native" in results:
            kv = kv_cache_bytes(args.shape, args.seqs, args.prompt_tokens + args.new_tokens)
            print(
                f"targets for native: peak RSS <= {(size * 1.3 + kv) / 2**20:,.0f} MiB (file x 1.3 + KV), load <= 1 s"
                + (
                    f", tok/s >= llama.cpp's {results['llama.cpp']['tokens'] / results['llama.cpp']['run_s']:.1f}"
                    if "llama.cpp" in results
                    else ""
                )
            )


if __name__ == "__main__":
    main()
