"""Latency of a small high-priority batch behind a large low-priority one: priorities on, against both batches
at normal priority, through the real path (submit, Redis, one BatchWorker on the default model).

    python benchmarks/priority.py [--low 128] [--low-tokens 128] [--high 8] [--high-tokens 32]

Each run starts an embedded Redis, submits the low batch, starts a BatchWorker (the engine's defaults: 64
sequences at once, 1 GiB of KV cache) and waits until every seat of its engine is taken, then submits the high
batch. For the high batch it reports, from that submission: the time to first token of its first and of its
last request (read from the worker's engine every 5 ms, so within a few ms and one engine step) and the time
until its last request finished (its rows' finished_at). The worker is then stopped, so the low batch is not
run to its end. The first run has the low batch at low priority and the high one at high priority, the second
has both at normal (first in, first out); the ratios are second over first. Every request has
ignore_eos, so each low request runs exactly --low-tokens tokens.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "prompts.jsonl"
POLL_S = 0.005


@dataclass
class Latency:
    first_token_s: float  # the first of the high requests to get a token
    last_first_token_s: float  # the last of them to get one
    finished_s: float  # the last of them to finish
    preemptions: int


def write_batch(path: Path, prefix: str, n: int, max_tokens: int) -> Path:
    """n chat requests over the questions of the example prompts, each made distinct by its number."""
    lines = [json.loads(line) for line in EXAMPLES.read_text().splitlines() if line.strip()]
    questions = [line["messages"][-1]["content"] for line in lines if "messages" in line]
    with path.open("w") as f:
        for i in range(n):
            question = questions[i % len(questions)]
            f.write(
                json.dumps(
                    {
                        "id": f"{prefix}{i}",
                        "messages": [{"role": "user", "content": f"{question} ({i})"}],
                        "max_tokens": max_tokens,
                        "temperature": 0,
                        "ignore_eos": True,
                    }
                )
                + "\n"
            )
    return path


def run(args, low_priority: str, high_priority: str) -> Latency:
    import pyarrow.parquet as pq
    from rq.serializers import JSONSerializer

    from miro.worker import BatchWorker
    from miro.worker.fleet.records import batches
    from miro.worker.fleet.records.embedded_redis import EmbeddedRedis
    from miro.worker.fleet.intake.routing import queue_for
    from miro.worker.fleet.intake.submit import submit

    with tempfile.TemporaryDirectory() as folder, EmbeddedRedis(Path(folder) / "redis") as conn:
        out = Path(folder) / "out"
        low = write_batch(Path(folder) / "low.jsonl", "low", args.low, args.low_tokens)
        high = write_batch(Path(folder) / "high.jsonl", "high", args.high, args.high_tokens)
        submit(conn, low, output=str(out), model=args.model, priority=low_priority)
        worker = BatchWorker([queue_for(args.model)], connection=conn, serializer=JSONSerializer, model=args.model)
        worker.handle_signals = False
        thread = threading.Thread(target=worker.work, kwargs={"burst": True, "logging_level": "WARNING"})
        thread.start()
        try:
            while worker.engine is None or len(worker.engine.scheduler.running) < min(
                worker.engine.scheduler.max_num_seqs, args.low
            ):
                time.sleep(POLL_S)
            preempted_before = worker.engine.scheduler.num_preemptions
            submitted_at = time.time()
            batch_id = submit(conn, high, output=str(out), model=args.model, priority=high_priority).batch_id
            job_ids = {batches.job_id(batch_id, f"high{i}") for i in range(args.high)}
            first_token: dict[str, float] = {}
            while batches.get_batch(conn, batch_id).status != "completed":
                for job_id in job_ids - first_token.keys():
                    request = worker.engine.requests.get(job_id)
                    if request is not None and request.seqs[0].output_token_ids:
                        first_token[job_id] = time.time() - submitted_at
                time.sleep(POLL_S)
            preemptions = worker.engine.scheduler.num_preemptions - preempted_before
        finally:
            worker.request_warm_stop(grace_s=0)
            thread.join()
        finished = pq.read_table(out / batch_id, columns=["finished_at"]).column("finished_at").to_pylist()
        # a request that finished between two looks at the engine counts its first token when it finished
        ends = [t.timestamp() - submitted_at for t in finished]
        starts = sorted(first_token.values()) + [max(ends)] * (args.high - len(first_token))
        return Latency(min(starts), max(starts), max(ends), preemptions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--low", type=int, default=128, help="requests in the low-priority batch")
    parser.add_argument("--low-tokens", type=int, default=128, help="tokens each low request generates")
    parser.add_argument("--high", type=int, default=8, help="requests in the high-priority batch")
    parser.add_argument("--high-tokens", type=int, default=32, help="tokens each high request generates")
    args = parser.parse_args()

    runs = {"priorities (low, high)": run(args, "low", "high"), "both normal": run(args, "normal", "normal")}
    print(
        f"{args.high} high requests of {args.high_tokens} tokens behind {args.low} low ones of "
        f"{args.low_tokens} tokens, one worker on {args.model}; seconds from the high batch's submission:"
    )
    print(f"{'run':24} {'first token':>12} {'last first token':>17} {'all finished':>13} {'preemptions':>12}")
    for name, r in runs.items():
        print(
            f"{name:24} {r.first_token_s:12.2f} {r.last_first_token_s:17.2f} {r.finished_s:13.2f} {r.preemptions:12d}"
        )
    on, off = runs.values()
    print(
        f"both normal / priorities: first token {off.first_token_s / on.first_token_s:.1f}x, "
        f"all finished {off.finished_s / on.finished_s:.1f}x"
    )


if __name__ == "__main__":
    main()
