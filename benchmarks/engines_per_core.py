"""One engine of N threads against N engines of one thread each (as N workers of `--threads 1` would run), on the
same ShareGPT prompts: how to spend a machine's cores on a model.

    python benchmarks/engines_per_core.py [--model smollm2-135m] [--engines 2] [--prompts 48] [--rounds 3]

The prompts are throughput.py's (load_sharegpt: the first human turn of each conversation in the model's chat
template, as many new tokens as the reference answer has, at most 256), greedy, EOS ignored. Each round runs, in
turn, one process of --engines threads on all the prompts, then --engines processes of one thread at once, each on
its share of the prompts (dealt largest first to the lightest share, by prompt + new tokens). Every process loads
the model and warms up on 4 other prompts before a common start time; its generate time alone is timed, and a
split run's time is its slowest process's. tokens/s counts prompt + generated tokens. Prints each round and the
median of the rounds' ratios (split / one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from throughput import load_sharegpt, total_tokens

START_DELAY_S = 30  # every process loaded and warmed up by then


def child(job: dict) -> float:
    """Load, warm up, wait for the common start, generate; returns the generate seconds."""
    import numba
    from threadpoolctl import threadpool_limits

    numba.set_num_threads(job["threads"])
    threadpool_limits(job["threads"])
    from miro.core import Engine, SamplingParams

    engine = Engine.from_model(job["model"], max_model_len=2048)

    def run(requests):
        params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for _, n in requests]
        engine.generate([p for p, _ in requests], params, use_tqdm=False)

    run([(p, 8) for p, _ in job["warm"]])
    time.sleep(max(0.0, job["start"] - time.time()))
    t0 = time.perf_counter()
    run(job["requests"])
    return time.perf_counter() - t0


def deal(requests: list, n: int) -> list[list]:
    """The requests in n shares of about equal prompt + new tokens, the largest dealt first."""
    shares, loads = [[] for _ in range(n)], [0] * n
    for request in sorted(requests, key=lambda r: -(len(r[0]) + r[1])):
        lightest = loads.index(min(loads))
        shares[lightest].append(request)
        loads[lightest] += len(request[0]) + request[1]
    return shares


def timed_run(model: str, shares: list[list], warm: list, threads: int, folder: Path) -> float:
    """Seconds until the slowest of the processes (one per share) has generated its share."""
    start = time.time() + START_DELAY_S
    procs = []
    for i, share in enumerate(shares):
        job_file = folder / f"job{i}.json"
        job = dict(model=model, requests=share, warm=warm, threads=threads, start=start)
        job_file.write_text(json.dumps(job))
        command = [sys.executable, __file__, "--child", str(job_file)]
        procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
    seconds = []
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"a child failed ({proc.returncode})")
        seconds.append(float(out.split("RESULT ", 1)[1].split()[0]))
    return max(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--engines", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT", child(json.loads(Path(args.child).read_text())), flush=True)
        return

    from miro.core import Engine
    from miro.core.loading.registry import resolve_model

    model = str(resolve_model(args.model))
    tokenizer = Engine.from_model(model, num_kv_blocks=1).tokenizer
    requests = [(p, min(n, 256)) for p, n in load_sharegpt(tokenizer, args.prompts + 4)]
    requests, warm = requests[: args.prompts], requests[args.prompts :]
    tokens = total_tokens(requests)
    print(
        f"{Path(model).name}: {len(requests)} ShareGPT prompts, {tokens} tokens a run; "
        f"1 engine of {args.engines} threads against {args.engines} engines of 1 thread; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(1, args.rounds + 1):
            one = tokens / timed_run(model, [requests], warm, args.engines, Path(tmp))
            split = tokens / timed_run(model, deal(requests, args.engines), warm, 1, Path(tmp))
            ratios.append(split / one)
            print(
                f"round {r}: one engine {one:.1f} tok/s, {args.engines} engines {split:.1f} tok/s: "
                f"{ratios[-1]:.2f}x; load average {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    print(
        f"median {args.engines} engines / one: {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}x)"
    )


if __name__ == "__main__":
    main()
