"""Priorities through a real redis-server and a BatchWorker on the tiny model: high batches are taken first, a
high batch reaches a worker full of low requests, and cancel, retry and --resume work on a high batch."""

import json
import threading

import pyarrow.parquet as pq
import pytest
import redis
from click.testing import CliRunner
from gguf_factory import write_tiny_llama
from polling import wait_for
from rq import Queue
from rq.serializers import JSONSerializer

from miro.cli.main import cli
from miro.worker import BatchWorker
from miro.worker.fleet.records import batches
from miro.worker.fleet.intake.routing import priority_queue, queue_for

pytestmark = pytest.mark.usefixtures("one_request_per_job")  # they follow one request's RQ job


def submit(tmp_path, redis_url, tiny_model, name, priority, lines) -> str:
    dataset = tmp_path / f"{name}.jsonl"
    dataset.write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = CliRunner().invoke(
        cli,
        [
            "submit",
            str(dataset),
            "--redis-url",
            redis_url,
            "--model",
            tiny_model,
            "--output",
            str(tmp_path / "out"),
            "--priority",
            priority,
            "--skip-invalid",
        ],
    )
    assert done.exit_code == 0, done.output
    return done.stdout.strip().splitlines()[-1]


def requests(prefix, n, max_tokens):
    return [
        {
            "id": f"{prefix}{i}",
            "prompt": f"hello {prefix} {i}",
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        for i in range(n)
    ]


def rows(tmp_path, batch_id) -> list[dict]:
    return pq.read_table(tmp_path / "out" / batch_id).to_pylist()


def queue(conn, tiny_model, priority) -> Queue:
    return Queue(priority_queue(queue_for(tiny_model), priority), connection=conn, serializer=JSONSerializer)


def test_a_worker_takes_the_high_batch_before_the_low_one_queued_first(tmp_path, redis_url, tiny_model):
    low = submit(tmp_path, redis_url, tiny_model, "low", "low", requests("l", 4, 3))
    high = submit(tmp_path, redis_url, tiny_model, "high", "high", requests("h", 2, 3))
    ran = CliRunner().invoke(
        cli,
        [
            "worker",
            "--redis-url",
            redis_url,
            "--model",
            tiny_model,
            "--burst",
            "--kv-cache-memory",
            "4MiB",
            "--max-num-seqs",
            "2",
        ],
    )
    assert ran.exit_code == 0, ran.output
    conn = redis.Redis.from_url(redis_url)
    assert [batches.get_batch(conn, b).status for b in (low, high)] == ["completed", "completed"]
    # two seats: the high requests take them, and the low ones start only once both have finished
    assert max(r["finished_at"] for r in rows(tmp_path, high)) <= min(r["started_at"] for r in rows(tmp_path, low))


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory) -> str:
    """The tiny model with a 4,096-token context: its low requests run for seconds, so the high batch surely
    arrives while they run."""
    return str(
        write_tiny_llama(tmp_path_factory.mktemp("m") / "tiny-long.gguf", tensor_type="Q8_0", context_length=4096)[
            "path"
        ]
    )


def test_a_high_batch_reaches_a_worker_full_of_low_requests_and_finishes_first(tmp_path, redis_url, long_context_model):
    conn = redis.Redis.from_url(redis_url)
    model = long_context_model
    low = submit(tmp_path, redis_url, model, "low", "low", requests("l", 2, 3000))
    worker = BatchWorker(
        [queue_for(model)],
        connection=conn,
        serializer=JSONSerializer,
        model=model,
        engine_options={"kv_cache_memory": "64MiB", "max_num_seqs": 2},
        flush_rows=1,
    )
    running = threading.Thread(target=worker.work, kwargs={"burst": True})
    running.start()
    try:
        wait_for(
            lambda: (
                worker.engine is not None
                and worker.engine.stats().generation_tokens_total > 0
                or not running.is_alive()
            ),
            timeout_s=120,
            every_s=0.01,
        )
        assert running.is_alive() and len(worker.in_flight) == 2, "the worker should be full of low requests"
        high = submit(tmp_path, redis_url, model, "high", "high", requests("h", 2, 4))
    finally:
        running.join(timeout=300)
    assert [batches.get_batch(conn, b).status for b in (low, high)] == ["completed", "completed"]
    assert worker.engine.stats().preemptions >= 2  # both seats were taken by low requests
    low_rows, high_rows = rows(tmp_path, low), rows(tmp_path, high)
    assert all(r["completion_tokens"] == 3000 for r in low_rows)
    assert min(r["started_at"] for r in high_rows) > max(r["started_at"] for r in low_rows)  # it came later
    assert max(r["finished_at"] for r in high_rows) < min(r["finished_at"] for r in low_rows)  # and left first


def test_cancel_resume_and_retry_of_a_high_batch(tmp_path, redis_url, tiny_model):
    conn = redis.Redis.from_url(redis_url)
    lines = requests("h", 3, 2) + [{"id": "long", "prompt": "hello " * 200, "max_tokens": 2}]  # over the context
    high = submit(tmp_path, redis_url, tiny_model, "high", "high", lines)
    assert queue(conn, tiny_model, "high").count == 4

    cancelled = CliRunner().invoke(cli, ["cancel", high, "--redis-url", redis_url])
    assert cancelled.exit_code == 0, cancelled.output
    assert batches.get_batch(conn, high).status == "cancelled"
    assert queue(conn, tiny_model, "high").count == 0

    resumed = CliRunner().invoke(
        cli, ["submit", str(tmp_path / "high.jsonl"), "--redis-url", redis_url, "--resume", high]
    )
    assert resumed.exit_code == 0, resumed.output
    assert queue(conn, tiny_model, "high").count == 4 and queue(conn, tiny_model, "normal").count == 0

    BatchWorker(
        [queue_for(tiny_model)],
        connection=conn,
        serializer=JSONSerializer,
        model=tiny_model,
        engine_options={"kv_cache_memory": "4MiB"},
    ).work(burst=True)
    record = batches.get_batch(conn, high)
    assert (record.status, record.completed, record.failed) == ("completed", 3, 1)

    retried = CliRunner().invoke(cli, ["retry", high, "--redis-url", redis_url])
    assert retried.exit_code == 0, retried.output
    assert queue(conn, tiny_model, "high").count == 1
