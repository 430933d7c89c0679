"""A rerun that costs only what changed (issue 42): `miro run` of N greedy lines, then 1% of the lines edited and
`miro run --reuse` of the first run's results, then (with --fresh) the edited file run again from scratch.

    python benchmarks/rerun_reuse.py [--lines 100000] [--edited 0.01] [--max-tokens 8] [--model tiny|PATH] [--fresh]
                                     [--flush-seconds 1]

Each `miro run` is its own process (embedded Redis, one worker, the merged results written), timed from its start
to its exit: model load, validation and the results included. The model is a tiny random-weight llama (Q8_0,
tests/gguf_factory.py: 2 layers, a 128-token context) unless --model names another; every line asks for
--max-tokens tokens at temperature 0 with ignore_eos, so each run generates the same number of tokens. It prints
both walls and CPU times (each process and its children: less moved by other processes on a shared machine) and
their ratios (target at most 0.05), how many rows were reused, and with --fresh that the rerun's rows
equal the fresh run's in every column but the run's own (batch, job, worker, times, cached tokens, reused_from).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # gguf_factory: a tiny random-weight model

RUN_COLUMNS = {"batch_id", "job_id", "worker", "started_at", "finished_at", "latency_s", "cached_tokens", "reused_from"}


def run(dataset: Path, out: Path, model: str, *extra: str) -> tuple[float, float, str]:
    """One `miro run` process: (wall s, CPU s of it and its children, stderr)."""
    started, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from miro.cli.main import cli; cli()",
            "run",
            str(dataset),
            "-o",
            str(out),
            "--model",
            model,
            "--kv-cache-memory",
            "64MiB",
            *extra,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "TERM": "dumb"},
    )
    wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"miro run failed: {done.stderr[-3000:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu, done.stderr


def write_lines(path: Path, lines: int, max_tokens: int, edited: set[int]) -> None:
    with open(path, "w") as f:
        for i in range(lines):
            prompt = f"edited line {i}, say something" if i in edited else f"line {i}: tell me about item {i % 977}"
            f.write(
                json.dumps(
                    {
                        "id": f"r{i}",
                        "prompt": prompt,
                        "max_tokens": max_tokens,
                        "temperature": 0,
                        "ignore_eos": True,
                        "group": i % 10,
                    }
                )
                + "\n"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--edited", type=float, default=0.01)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--fresh", action="store_true", help="also run the edited file from scratch and compare")
    parser.add_argument(
        "--flush-seconds",
        type=float,
        default=1.0,
        help="miro run's --flush-seconds, in every run (its default 5 s is a rerun's floor)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = args.model
        flush = ("--flush-seconds", str(args.flush_seconds))
        if model == "tiny":
            from gguf_factory import write_tiny_llama

            model = str(write_tiny_llama(folder / "tiny.gguf", tensor_type="Q8_0")["path"])
        first = folder / "first.jsonl"
        write_lines(first, args.lines, args.max_tokens, set())
        first_wall, first_cpu, _ = run(first, folder / "first.parquet", model, *flush)
        print(f"first run: {args.lines:,} lines in {first_wall:.1f} s ({first_cpu:.1f} s CPU)", flush=True)
        step = max(1, round(1 / args.edited))
        edited = set(range(0, args.lines, step))
        second = folder / "second.jsonl"
        write_lines(second, args.lines, args.max_tokens, edited)
        rerun_wall, rerun_cpu, stderr = run(
            second, folder / "second.parquet", model, *flush, "--reuse", str(folder / "first.parquet")
        )
        said = next((line for line in stderr.splitlines() if line.startswith("Reused")), "")
        print(f"rerun with --reuse ({len(edited):,} lines edited): {rerun_wall:.1f} s ({rerun_cpu:.1f} s CPU); {said}")
        print(
            f"rerun / first run: wall {rerun_wall / first_wall:.3f}x, CPU {rerun_cpu / first_cpu:.3f}x (target <= 0.05)"
        )
        if args.fresh:
            fresh_wall, _, _ = run(second, folder / "fresh.parquet", model, *flush)
            rerun = pq.read_table(folder / "second.parquet")
            fresh = pq.read_table(folder / "fresh.parquet")
            columns = [c for c in fresh.column_names if c not in RUN_COLUMNS]
            same = rerun.select(columns).equals(fresh.select(columns))
            print(
                f"fresh run of the edited file: {fresh_wall:.1f} s; rerun rows equal the fresh run's in every "
                f"column but the run's own: {same}"
            )


if __name__ == "__main__":
    main()
