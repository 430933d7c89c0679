"""What Redis keeps of a finished batch until its TTL (issue 37): a batch of N short requests is submitted, each
request counted completed as a worker counts it (`batches.queue_count_finished`, a pipeline of 1,000), the batch
released as its last counter releases it; Redis's used_memory before the batch, once every request is counted (the
`:counted` set is full) and after the release (the set has gone to storage: counted.py), and how long the move took.
Then `counted.restore` (what --resume and miro retry do first) and its time.

    python benchmarks/counted_memory.py [--requests 1000000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import start_redis  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    from miro.worker.fleet.records import batches, keys
    from miro.worker.fleet.lifecycle import counted, release
    from miro.worker.fleet.intake.submit import submit

    figures: dict = {"requests": args.requests}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        proc, url = start_redis(workdir)
        try:
            conn = redis.Redis.from_url(url)
            path = workdir / "in.jsonl"
            with open(path, "w") as f:
                for i in range(args.requests):
                    f.write(json.dumps({"custom_id": f"request-{i:09d}", "prompt": "hi", "max_tokens": 2}) + "\n")
            figures["redis_before_mb"] = round(conn.info("memory")["used_memory"] / 1e6, 1)
            batch_id = submit(conn, path, output=str(workdir / "out")).batch_id
            for start in range(0, args.requests, 1000):
                with conn.pipeline(transaction=False) as pipe:
                    for i in range(start, min(start + 1000, args.requests)):
                        batches.queue_count_finished(
                            pipe, batch_id, f"request-{i:09d}", prompt_tokens=1, completion_tokens=1
                        )
                    pipe.execute()
            assert batches.get_batch(conn, batch_id).status == "completed"
            figures["redis_counted_mb"] = round(conn.info("memory")["used_memory"] / 1e6, 1)
            figures["counted_set_mb"] = round(conn.memory_usage(keys.batch_counted(batch_id), samples=0) / 1e6, 1)
            started = time.perf_counter()
            release.release_if_ended(conn, batch_id)
            figures["release_s"] = round(time.perf_counter() - started, 1)
            assert not conn.exists(keys.batch_counted(batch_id))
            time.sleep(1)  # UNLINK frees it on Redis's background thread
            figures["redis_after_release_mb"] = round(conn.info("memory")["used_memory"] / 1e6, 1)
            figures["stored_file_mb"] = round((workdir / "out" / batch_id / counted.FILE).stat().st_size / 1e6, 1)
            started = time.perf_counter()
            assert counted.restore(conn, batches.get_batch(conn, batch_id)) == args.requests
            figures["restore_s"] = round(time.perf_counter() - started, 1)
        finally:
            proc.terminate()
            proc.wait()
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
