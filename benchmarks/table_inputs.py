"""A dataset as Parquet against the same data as JSON Lines through `miro submit`'s validation and spool path
(issue 42): N ShareGPT-like prompts with three columns of their own (category, turns, score).

    python benchmarks/table_inputs.py [--rows 1000000] [--rounds 3] [--json out.json]

Each round submits the JSONL file, then the Parquet file (`--prompt-column text`), each in its own process onto a
redis-server of its own (`miro submit --output FOLDER`: every row validated, every request written to the batch's
stored chunks, the first window of jobs queued), and reads the process's wall time, CPU time (user + system: less
moved by other processes on a shared machine than wall time) and peak RSS: the process's own (VmHWM, Linux), not
getrusage's ru_maxrss, which in a child started after this script made its rows carries this script's high-water
mark (kept across fork and exec: about 1 KB a row, the rows' Python strings, read as submit's until 2026-12-05). It prints
the medians and their ratios (Parquet / JSONL), and checks that both submissions stored the same requests, byte
for byte, in the same order (the own columns included): the stored chunks' sha256 over every request. The prompts
are synthetic (a ShareGPT-like mix of short questions and long pasted passages from a fixed vocabulary, seeded),
so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from scale import start_redis  # noqa: E402

WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two more write "
    "go see number no way could people my than first water been call who oil its now find long down day did "
    "get come made may part code function error python table query model data train loss learning"
).split()
CATEGORIES = ["coding", "writing", "math", "chat", "translation", "summary"]


def make_columns(rows: int, seed: int = 0) -> dict:
    """ShareGPT-like prompt lengths: most a sentence or two, a tail of pasted passages (lognormal, median ~30 words,
    mean ~60, capped at 2,000)."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.lognormal(3.4, 1.0, rows).astype(int) + 3, 2000)
    vocabulary = np.array(WORDS)
    text = []
    for length in lengths:
        words = vocabulary[rng.integers(0, len(vocabulary), length)]
        text.append(" ".join(words).capitalize() + "?")
    return {
        "id": [f"s{i}" for i in range(rows)],
        "text": text,
        "category": [CATEGORIES[i] for i in rng.integers(0, len(CATEGORIES), rows)],
        "turns": rng.integers(1, 9, rows).tolist(),
        "score": np.round(rng.random(rows), 4).tolist(),
    }


def write_files(folder: Path, rows: int) -> tuple[Path, Path]:
    columns = make_columns(rows)
    parquet = folder / "prompts.parquet"
    pq.write_table(pa.table(columns), parquet, compression="zstd", row_group_size=65_536)
    jsonl = folder / "prompts.jsonl"
    names = list(columns)
    with open(jsonl, "w") as f:
        for values in zip(*columns.values()):
            line = dict(zip(names, values))
            line["prompt"] = line.pop("text")
            f.write(json.dumps(line) + "\n")
    return jsonl, parquet


def submit(dataset: Path, output: Path, *extra: str) -> tuple[float, float, float]:
    """`miro submit` in its own process onto a fresh redis-server: (wall s, peak RSS MB, CPU s)."""
    workdir = Path(tempfile.mkdtemp(dir=output.parent))
    proc, url = start_redis(workdir)
    try:
        script = (
            "import resource, sys, time\n"
            "from miro.cli.main import cli\n"
            "started = time.perf_counter()\n"
            "try:\n    cli(sys.argv[1:])\n"
            "except SystemExit as e:\n    code = e.code\n"
            "usage = resource.getrusage(resource.RUSAGE_SELF)\n"
            "peak = [int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmHWM:')]\n"
            "print('BENCH', time.perf_counter() - started, peak[0] / 1024, code, "
            "usage.ru_utime + usage.ru_stime, file=sys.stderr)\n"
        )
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                script,
                "submit",
                str(dataset),
                "--redis-url",
                url,
                "--output",
                str(output),
                "--max-tokens",
                "16",
                *extra,
            ],
            capture_output=True,
            text=True,
        )
        line = next((x for x in done.stderr.splitlines() if x.startswith("BENCH")), None)
        if line is None or line.split()[3] not in ("0", "None"):
            raise SystemExit(f"submit failed: {done.stderr[-2000:]}")
        _, wall, rss, _, cpu = line.split()
        return float(wall), float(rss), float(cpu)
    finally:
        proc.terminate()
        proc.wait()


def stored_digest(output: Path) -> str:
    """sha256 over the batch's stored requests, chunk by chunk in order (output holds one batch)."""
    [batch] = [p for p in output.iterdir() if p.is_dir()]
    digest = hashlib.sha256()
    for chunk in sorted((batch / "_requests").iterdir()):
        digest.update(chunk.read_bytes())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        started = time.perf_counter()
        jsonl, parquet = write_files(folder, args.rows)
        print(
            f"{args.rows:,} rows: JSONL {jsonl.stat().st_size / 2**20:,.0f} MiB, Parquet "
            f"{parquet.stat().st_size / 2**20:,.0f} MiB (written in {time.perf_counter() - started:.0f} s)"
        )
        results = {"jsonl": [], "parquet": []}
        digests = {}
        for round_ in range(args.rounds):
            for name, dataset, extra in (("jsonl", jsonl, ()), ("parquet", parquet, ("--prompt-column", "text"))):
                output = folder / f"out-{name}-{round_}"
                output.mkdir()
                wall, rss, cpu = submit(dataset, output, *extra)
                results[name].append((wall, rss, cpu))
                digests.setdefault(name, stored_digest(output))
                print(
                    f"round {round_ + 1} {name:8s} {wall:7.1f} s wall, {cpu:7.1f} s CPU, peak RSS {rss:7.0f} MB",
                    flush=True,
                )
                subprocess.run(["rm", "-rf", str(output)])
        median = {name: [statistics.median(run[k] for run in runs) for k in range(3)] for name, runs in results.items()}
        same = digests["jsonl"] == digests["parquet"]
        for name in ("jsonl", "parquet"):
            wall, rss, cpu = median[name]
            print(f"median {name:8s} {wall:.1f} s wall, {cpu:.1f} s CPU, {rss:.0f} MB")
        ratio = [p / j for p, j in zip(median["parquet"], median["jsonl"])]
        print(
            f"Parquet / JSONL: wall {ratio[0]:.3f}x, CPU {ratio[2]:.3f}x, peak RSS {ratio[1]:.3f}x; stored "
            f"requests identical (columns and order): {same}"
        )
        if args.json:
            Path(args.json).write_text(
                json.dumps({"rows": args.rows, "runs": results, "median": median, "identical": same}, indent=1)
            )


if __name__ == "__main__":
    main()
