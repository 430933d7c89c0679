"""The typed records miro keeps in Redis (batches.BatchRecord, workers.WorkerRecord) written and read back on a
real Redis, through bytes and decoded connections, and read from hashes written before a field existed."""

from __future__ import annotations

import time

import pytest
import redis

from miro.core.engine.stats import EngineStats
from miro.worker.fleet.records import batches, keys, workers
from miro.worker.fleet.records.batches import BatchRecord
from miro.worker.fleet.records.workers import WorkerRecord


@pytest.mark.parametrize("decode", [False, True])
def test_a_batch_record_reads_back_as_written(redis_url, decode):
    conn = redis.Redis.from_url(redis_url, decode_responses=decode)
    record = BatchRecord(
        id="batch_a",
        status="cancelled",
        created_at=1000.5,
        name="d.jsonl",
        model="m",
        queue="miro:m",
        total=10,
        completed=2,
        failed=1,
        cancelled=7,
        prompt_tokens=6,
        completion_tokens=8,
        job_timeout=60,
        stamps={"validating": 1000.5, "cancelled": 1009.25},
    )
    conn.hset(record.key(record.id), mapping=record.to_hash())
    read = BatchRecord.from_hash(conn.hgetall(record.key(record.id)))
    assert read == record
    assert (read.done, read.finished, read.remaining, read.tokens) == (10, 3, 0, 14)
    assert read.at("cancelled") == 1009.25 and read.at("completed") is None


def test_a_batch_record_from_before_priorities_and_counters_reads_with_their_defaults(redis_url):
    conn = redis.Redis.from_url(redis_url)
    conn.hset(
        BatchRecord.key("batch_old"),
        mapping={
            "id": "batch_old",
            "status": "in_progress",
            "created_at": "5",
            "in_progress_at": "6",
            "total": "4",
            "completed": "1",
        },
    )
    old = batches.get_batch(conn, "batch_old")
    assert (old.priority, old.failed, old.cancelled, old.job_timeout, old.done) == ("normal", 0, 0, None, 1)
    assert old.elapsed_s(now=16.0) == 10.0


def test_a_worker_record_reads_back_as_published(redis_url):
    conn = redis.Redis.from_url(redis_url)
    record = WorkerRecord(
        name="w1",
        model="m",
        host="h",
        pid=7,
        queues=["miro:m:high", "miro:m"],
        state="busy",
        started_at=1.0,
        updated_at=2.0,
        batches=["batch_a"],
        architecture="llama",
        weight_format="native",
        weight_memory=0,
        cpu_tier="avx2",
        stats=EngineStats(
            kv_blocks_used=3,
            kv_blocks_total=8,
            kv_usage=0.375,
            running=2,
            prompt_tokens_per_s=10.0,
            generation_tokens_per_s=30.0,
        ),
        in_flight=2,
        jobs_done=5,
    )
    workers.publish(conn, record)
    assert workers.get_worker(conn, "w1") == record and workers.list_workers(conn) == [record]
    assert conn.hget(record.key("w1"), "tokens_per_s") == b"40.0"  # for readers other than miro
    assert record.to_dict()["running"] == 2 and record.to_dict()["queues"] == ["miro:m:high", "miro:m"]


def test_a_worker_record_from_before_the_model_fields_has_none_of_them(redis_url):
    conn = redis.Redis.from_url(redis_url)
    conn.hset(WorkerRecord.key("w0"), mapping={"name": "w0", "queues": "", "running": "1"})
    old = workers.get_worker(conn, "w0")
    assert (old.weight_format, old.cpu_tier, old.queues, old.stats.running) == (None, None, [], 1)


def test_workers_are_found_by_their_index_and_a_dead_ones_name_goes(redis_url):
    conn = redis.Redis.from_url(redis_url)
    for i in range(3000):  # a large batch's job keys: nothing a reader of the workers walks through
        conn.set(f"rq:job:batch_x-{i}", "x")
    now = time.time()
    workers.publish(conn, WorkerRecord(name="live", model="m", updated_at=now))
    workers.publish(conn, WorkerRecord(name="stalled", model="m", updated_at=now - 10))
    workers.publish(conn, WorkerRecord(name="dead", model="m", updated_at=now - 120))
    conn.delete(WorkerRecord.key("stalled"), WorkerRecord.key("dead"))  # their hashes expired
    assert [w.name for w in workers.list_workers(conn)] == ["live"]
    assert conn.zrange(keys.workers(), 0, -1) == [b"stalled", b"live"]  # the long-gone name dropped
    workers.remove(conn, "live")  # a worker that stops cleanly takes its name out too
    assert conn.zrange(keys.workers(), 0, -1) == [b"stalled"]
