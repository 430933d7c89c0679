"""Where a batch's time goes, step by step: vllm_cpu.py's workload (ShareGPT prompts, greedy, EOS ignored) through
Engine.generate, each engine step's sequences, tokens and forward time, summed by kind and batch size.

    python benchmarks/batch_steps.py [--model PATH] [--prompts 48] [--max-tokens 256] [--weights native]

A step that computes prompt tokens (a prefill chunk, with the decodes beside it) counts as "prefill+", the others as
"decode"; each kind by its number of sequences (1-4, 5-8, 9-16, 17-32, 33-64, 65+). The kernels' passes follow the
rows a step has, so this says which batch sizes a run spends its time at: on vllm_cpu.py's 48 prompts on the 1B
shape, decodes of 33-48 sequences (stop 60). miro alone, no peer: the ratios are vllm_cpu.py's.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from throughput import load_sharegpt

WARM_PROMPTS = 4
SIZES = ((4, "1-4"), (8, "5-8"), (16, "9-16"), (32, "17-32"), (64, "33-64"))


def size_bucket(seqs: int) -> str:
    return next((name for top, name in SIZES if seqs <= top), "65+")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--weights", default="auto")
    args = parser.parse_args()

    from miro.core import Engine, SamplingParams
    from miro.core.loading.registry import resolve_model

    engine = Engine.from_model(resolve_model(args.model), max_model_len=2048, weights=args.weights)
    requests = [(p, min(n, args.max_tokens)) for p, n in load_sharegpt(engine.tokenizer, args.prompts + WARM_PROMPTS)]
    warm, requests = requests[args.prompts :], requests[: args.prompts]
    greedy = [SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)] * len(warm)
    engine.generate([p for p, _ in warm], greedy, use_tqdm=False)  # kernels compiled or loaded, outside the timing

    steps = []  # (sequences, tokens, seconds) of each forward pass
    execute = engine.runner.execute

    def timed(batch):
        t = time.perf_counter()
        out = execute(batch)
        steps.append((len(batch.seqs), sum(s.num_new_tokens for s in batch.seqs), time.perf_counter() - t))
        return out

    engine.runner.execute = timed
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for _, n in requests]
    t0 = time.perf_counter()
    outs = engine.generate([p for p, _ in requests], params, use_tqdm=False)
    wall = time.perf_counter() - t0

    prompt_tokens = sum(len(p) for p, _ in requests)
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    print(f"{args.model}: {len(requests)} prompts, {prompt_tokens} prompt and {generated} generated tokens")
    forward = sum(seconds for *_, seconds in steps)
    print(f"{len(steps)} steps, {wall:.1f} s ({forward:.1f} s forward), {(prompt_tokens + generated) / wall:.1f} tok/s")
    order = [name for _, name in SIZES] + ["65+"]
    totals = defaultdict(lambda: [0, 0, 0.0])  # (kind, size) -> steps, tokens, seconds
    for seqs, tokens, seconds in steps:
        total = totals[("prefill+" if tokens > seqs else "decode", size_bucket(seqs))]
        total[0] += 1
        total[1] += tokens
        total[2] += seconds
    print("| kind | sequences | steps | tokens | seconds | share | ms a step | tok/s |")
    print("|---|---|---|---|---|---|---|---|")
    for (kind, size), (n, tokens, seconds) in sorted(
        totals.items(), key=lambda item: (item[0][0], order.index(item[0][1]))
    ):
        print(
            f"| {kind} | {size} | {n} | {tokens} | {seconds:.1f} | {seconds / forward:.0%} | "
            f"{1e3 * seconds / n:.1f} | {tokens / seconds:.1f} |"
        )


if __name__ == "__main__":
    main()
