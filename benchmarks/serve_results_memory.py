"""What `miro serve` holds while it expires a big batch and serves its results (issue 37, finding 3): its resident
memory when idle, and its peak (VmHWM) after each step, on a local redis-server.

    python benchmarks/serve_results_memory.py [--requests 500000] [--ran 0.4] [--long-line-mb 100] [--json out.json]

The batch is made as `miro-submit` makes it (`submit()`: every request stored in chunks beside the part files, the
record, the first window of jobs), of OpenAI chat lines `req-00000001`...; no worker runs it: the part files of the
first `--ran` of its lines are written directly, as benchmarks/results_memory.py writes them (workers' rows, 256 to
a file, lines shuffled within windows of 4,096, 0.1% run twice, 1% failed). Its window is then made to end, and
the server's background loop expires it and writes its output and error files. Then the script downloads the
error file, `/v1/batches/{id}/results.parquet` and, the batch being listed as a Message Batch too, Anthropic's
results, checking each has one line or row per request. A small batch goes through the same steps first (--warm-up),
so that the idle figure the peak is compared with includes what the server loads once for any batch.

With --long-line-mb N it first uploads a file of one N MB line with no newline and creates a batch of it (issue 37,
finding 4): the batch fails, its error the line's size in one sentence, and the server's peak says what reading it
cost.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_memory import WINDOW, part_rows  # noqa: E402
from scale import free_port, start_redis  # noqa: E402


def dataset(path: Path, n: int) -> None:
    with open(path, "w") as f:
        for i in range(1, n + 1):
            f.write(
                json.dumps(
                    {
                        "custom_id": f"req-{i:08d}",
                        "method": "POST",
                        "url": "/v1/chat/completions",
                        "body": {
                            "model": "smollm2-135m",
                            "max_tokens": 16,
                            "messages": [
                                {"role": "user", "content": f"Write one short sentence about the number {i}."}
                            ],
                        },
                    }
                )
                + "\n"
            )


def write_parts(folder: Path, batch_id: str, n: int, per_part: int = 256) -> int:
    """Rows of lines 1..n as workers write them; returns how many part files."""
    from miro.worker.fleet.output.rows import SCHEMA

    rng = np.random.default_rng(0)
    lines = np.arange(1, n + 1, dtype=np.int64)
    for start in range(0, n, WINDOW):
        rng.shuffle(lines[start : start + WINDOW])
    order = np.concatenate([lines, np.sort(rng.choice(lines, size=n // 1000, replace=False))])
    count = 0
    for count, start in enumerate(range(0, len(order), per_part), 1):
        table = pa.Table.from_pylist(part_rows(batch_id, order[start : start + per_part], rng, False), SCHEMA)
        pq.write_table(table, folder / f"part-w1-bench-{count:06d}.parquet", compression="zstd")
    return count


def memory(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of the process in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) // 1024, int(fields["VmHWM"].split()[0]) // 1024


def get(url: str, sink: Path | None = None) -> bytes | int:
    """The body, or (with `sink`) how many bytes were streamed into it."""
    with urllib.request.urlopen(url, timeout=600) as response:
        if sink is None:
            return response.read()
        size = 0
        with open(sink, "wb") as out:
            while block := response.read(1 << 20):
                out.write(block)
                size += len(block)
        return size


class Bench:
    def __init__(self, workdir: Path, conn: redis.Redis, base: str, storage: Path, pid: int):
        self.workdir, self.conn, self.base, self.storage, self.pid = workdir, conn, base, storage, pid

    def batch(self, n: int, ran_share: float) -> tuple[str, dict]:
        """A batch of `n` requests, `ran_share` of them with rows, as described above; (its id, figures)."""
        from miro.worker.fleet.records import keys
        from miro.worker.fleet.intake.submit import submit

        started = time.perf_counter()
        path = self.workdir / f"in-{n}.jsonl"
        dataset(path, n)
        batch_id = submit(
            self.conn, path, output=str(self.storage / "batches"), endpoint="/v1/chat/completions"
        ).batch_id
        ran = int(n * ran_share)
        parts = write_parts(self.storage / "batches" / batch_id, batch_id, ran)
        self.conn.zadd(keys.message_batches(), {batch_id: time.time()})
        figures = {"part_files": parts, "setup_s": round(time.perf_counter() - started, 1)}
        print(
            f"batch {batch_id}: {n:,} requests, {ran:,} with rows ({parts:,} part files), made in "
            f"{figures['setup_s']} s",
            flush=True,
        )
        return batch_id, figures

    def expire_and_serve(self, batch_id: str, n: int) -> dict:
        """Expire it; wait for its files; download them, results.parquet and Anthropic's results (the server's peak
        after each step)."""
        from miro.worker.fleet.records import keys

        figures, base, workdir = {}, self.base, self.workdir
        started = time.perf_counter()
        self.conn.hset(keys.batch(batch_id), "expires_at", time.time() - 1)
        self.conn.zadd(keys.batch_deadlines(), {batch_id: 0})
        while True:
            shown = json.loads(get(f"{base}/v1/batches/{batch_id}"))
            if shown["status"] == "expired" and shown["error_file_id"]:
                break
            time.sleep(0.5)
        figures["expire_and_files_s"] = round(time.perf_counter() - started, 1)
        _, figures["peak_after_files_mib"] = memory(self.pid)
        print(
            f"expired, files written in {figures['expire_and_files_s']} s: {shown['request_counts']}; "
            f"peak {figures['peak_after_files_mib']} MiB",
            flush=True,
        )
        lines = 0
        for key in ("output_file_id", "error_file_id"):
            if shown[key]:
                get(f"{base}/v1/files/{shown[key]}/content", workdir / "file.jsonl")
                lines += sum(1 for _ in open(workdir / "file.jsonl", "rb"))
        assert lines == n, (lines, n)
        _, figures["peak_after_file_content_mib"] = memory(self.pid)
        started = time.perf_counter()
        get(f"{base}/v1/batches/{batch_id}/results.parquet", workdir / "results.parquet")
        figures["results_parquet_s"] = round(time.perf_counter() - started, 1)
        assert pq.ParquetFile(workdir / "results.parquet").metadata.num_rows == n
        _, figures["peak_after_results_parquet_mib"] = memory(self.pid)
        started = time.perf_counter()
        get(f"{base}/v1/messages/batches/{batch_id}/results", workdir / "anthropic.jsonl")
        figures["anthropic_results_s"] = round(time.perf_counter() - started, 1)
        assert sum(1 for _ in open(workdir / "anthropic.jsonl", "rb")) == n
        figures["rss_after_mib"], figures["peak_after_anthropic_mib"] = memory(self.pid)
        return figures


def long_line(workdir: Path, base: str, pid: int, megabytes: int) -> dict:
    """Upload a file of one line with no newline and create a batch of it: the server's peak before and after."""
    from openai import OpenAI

    path = workdir / "one_line.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": "')
        for _ in range(megabytes):
            f.write(b"y" * (1 << 20))
    client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)
    uploaded = client.files.create(file=open(path, "rb"), purpose="batch")
    _, before = memory(pid)
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    _, after = memory(pid)
    said = batch.errors.data[0].message if batch.errors and batch.errors.data else None
    print(
        f"a {megabytes} MB line: batch {batch.status} ({said}); the server's peak {before} -> {after} MiB", flush=True
    )
    path.unlink()
    return {
        "long_line_mb": megabytes,
        "long_line_status": batch.status,
        "long_line_error": said,
        "long_line_peak_before_create_mib": before,
        "long_line_peak_after_create_mib": after,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=500_000)
    parser.add_argument("--ran", type=float, default=0.4, help="the share of requests with rows when it expires")
    parser.add_argument(
        "--warm-up",
        type=int,
        default=2_000,
        help="requests of a first batch taken through the same steps, so that the idle figure "
        "includes what the server loads once (pyarrow's readers and writers)",
    )
    parser.add_argument(
        "--long-line-mb",
        type=int,
        default=0,
        help="first upload a file of one line of this many MB and create a batch of it",
    )
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()

    figures: dict = {"requests": args.requests, "ran": args.ran, "warm_up": args.warm_up}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        redis_proc, url = start_redis(workdir)
        server = None
        try:
            conn = redis.Redis.from_url(url)
            storage = workdir / "storage"
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            server = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "from miro.cli.main import cli; cli()",
                    "serve",
                    "--redis-url",
                    url,
                    "--port",
                    str(port),
                    "--storage",
                    str(storage),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for _ in range(600):
                try:
                    get(base + "/v1/batches?limit=1")
                    break
                except OSError:
                    time.sleep(0.1)
            bench = Bench(workdir, conn, base, storage, server.pid)
            time.sleep(2)
            figures["cold_idle_rss_mib"], _ = memory(server.pid)
            if args.long_line_mb:
                figures.update(long_line(workdir, base, server.pid, args.long_line_mb))
            if args.warm_up:
                warm_id, _ = bench.batch(args.warm_up, args.ran)
                bench.expire_and_serve(warm_id, args.warm_up)
            batch_id, made = bench.batch(args.requests, args.ran)
            figures.update(made)
            time.sleep(2)
            figures["idle_rss_mib"], figures["idle_peak_mib"] = memory(server.pid)
            figures.update(bench.expire_and_serve(batch_id, args.requests))
            figures["peak_over_idle_mib"] = figures["peak_after_anthropic_mib"] - figures["idle_rss_mib"]
            figures["redis_used_mb"] = round(conn.info("memory")["used_memory"] / 1e6, 1)
        finally:
            if server is not None:
                server.terminate()
                server.wait(timeout=30)
            redis_proc.terminate()
            redis_proc.wait()
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
