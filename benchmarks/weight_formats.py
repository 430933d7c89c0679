"""The default model with its weights dequantized to float32 against kept as stored (native), in one process.

    python benchmarks/weight_formats.py [--prompts 32] [--max-tokens 64] [--rounds 2]

Both engines run engine.generate on the same prompts (random token ids, 20-200 long, greedy, EOS ignored; new
ones each round, so the prefix cache does not help), f32 then native each round; it prints load time, weight memory and total tokens/s of each,
and the native/f32 ratio per round.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from miro.core import Engine, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    rng = np.random.default_rng(0)

    def new_prompts() -> list[list[int]]:
        return [
            [int(t) for t in rng.integers(100, 40000, size=int(rng.integers(20, 200)))] for _ in range(args.prompts)
        ]

    prompts = new_prompts()
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
    engines = {}
    for fmt in ("f32", "native"):
        started = time.perf_counter()
        engines[fmt] = Engine.from_model(args.model, weights=fmt, kv_cache_memory="1GiB")
        load_s = time.perf_counter() - started
        engines[fmt].generate(prompts[:2], SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)  # compile
        print(f"{fmt:>6}: load {load_s:.2f} s, weights hold {engines[fmt].weight_memory / 2**20:,.1f} MiB of their own")
    for round_ in range(args.rounds):
        prompts, rates = new_prompts(), {}
        for fmt, engine in engines.items():
            started = time.perf_counter()
            outs = engine.generate(prompts, params, use_tqdm=False)
            elapsed = time.perf_counter() - started
            tokens = sum(len(p) for p in prompts) + sum(len(o.outputs[0].token_ids) for o in outs)
            rates[fmt] = tokens / elapsed
        print(
            f"round {round_ + 1}: f32 {rates['f32']:.1f} tok/s, native {rates['native']:.1f} tok/s, "
            f"native/f32 {rates['native'] / rates['f32']:.2f}"
        )


if __name__ == "__main__":
    main()
