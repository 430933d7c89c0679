"""Windowed feeding on a real redis-server: a batch's requests wait in storage and become RQ group jobs a chunk at a
time.
Two feeders never write one chunk twice, a cancel or expiry counts the unfed requests cancelled at once (an expired
batch's come back as batch_expired rows), a resume feeds them again, and a BatchWorker tops the queue up itself, so
a batch bigger than its window runs to the end with each request once."""

import json
import threading

import pyarrow.parquet as pq
import pytest
import redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from miro.core import defaults
from miro.worker import BatchWorker
from miro.worker.fleet.records import batches, keys
from miro.worker.fleet.lifecycle import control, expiry
from miro.worker.fleet.intake import feed, spool
from miro.worker.fleet.output import results
from miro.worker.fleet.intake.job_writer import JobWriter
from miro.worker.fleet.records.payload import payloads_of
from miro.worker.fleet.intake.routing import queue_for
from miro.worker.fleet.intake.submit import submit


def dataset(tmp_path, n: int, max_tokens: int = 1):
    path = tmp_path / "d.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": f"r{i}", "prompt": f"hi {i}", "max_tokens": max_tokens, "temperature": 0}) + "\n"
            for i in range(n)
        )
    )
    return path


@pytest.fixture
def small_window(monkeypatch):
    """Windows of 10 requests in group jobs of 2 (a chunk of 5 makes 3 jobs), so a 23-request batch needs several
    feeds."""
    monkeypatch.setattr(defaults, "FEED_MARGIN", 10)
    monkeypatch.setattr(defaults, "REQUESTS_PER_JOB", 2)
    monkeypatch.setattr(defaults, "FEED_CHUNKS_PER_CALL", 1)


def new_batch(tmp_path, redis_url, n: int, model: str = "smollm2-135m", **options) -> tuple[redis.Redis, str]:
    conn = redis.Redis.from_url(redis_url)
    result = submit(conn, dataset(tmp_path, n), chunk_size=5, output=str(tmp_path / "out"), model=model, **options)
    return conn, result.batch_id


def queued_ids(conn, batch: batches.BatchRecord) -> list[str]:
    return Queue(batch.queue, connection=conn, serializer=JSONSerializer).job_ids


def test_submit_queues_a_window_and_stores_the_rest(tmp_path, redis_url, small_window):
    conn, batch_id = new_batch(tmp_path, redis_url, 23)
    batch = batches.get_batch(conn, batch_id)
    assert (batch.chunks, batch.spooled, batch.fed, batch.fed_requests, batch.total) == (5, 23, 2, 10, 23)
    assert queued_ids(conn, batch) == [batches.group_job_id(batch_id, c, p) for c in (0, 1) for p in (0, 1, 2)]
    group = Job.fetch(batches.group_job_id(batch_id, 1, 2), connection=conn, serializer=JSONSerializer)
    assert group.meta == {"batch_id": batch_id, "custom_ids": ["r9"]}
    assert [p.custom_id for p in payloads_of(group.kwargs)] == ["r9"]
    assert [
        p.line
        for p in payloads_of(
            Job.fetch(batches.group_job_id(batch_id, 0, 1), connection=conn, serializer=JSONSerializer).kwargs
        )
    ] == [3, 4]
    assert [r.custom_id for r in spool.read_chunk(batch.output, batch_id, 4)] == ["r20", "r21", "r22"]
    assert conn.hlen(keys.batch_jobs(batch_id)) == 0  # Redis holds the queued jobs, not the dataset nor an index


def test_a_chunk_is_written_once_however_many_feeders_race(tmp_path, redis_url, small_window):
    conn, batch_id = new_batch(tmp_path, redis_url, 23)
    conn.delete(Queue(batches.get_batch(conn, batch_id).queue, connection=conn).key)  # the fleet took the window
    threads = [threading.Thread(target=feed.feed, args=(conn, batch_id, 10)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    batch = batches.get_batch(conn, batch_id)
    assert (batch.fed, batch.fed_requests) == (4, 20)  # one feeder held the lock and filled the window again
    assert Queue(batch.queue, connection=conn).count == 6
    # a feeder that read an old position (it stalled, another moved on) writes nothing
    writer = JobWriter.for_batch(conn, batch)
    assert writer.feed(1, spool.read_chunk(batch.output, batch_id, 1)) == -1
    assert batches.get_batch(conn, batch_id).fed_requests == 20


def test_cancel_counts_the_unfed_at_once_and_resume_feeds_them_again(tmp_path, redis_url, small_window):
    conn, batch_id = new_batch(tmp_path, redis_url, 23)
    cancelled = control.cancel(conn, batch_id)
    batch = batches.get_batch(conn, batch_id)
    assert cancelled.status == "cancelled" and cancelled.removed == 6  # jobs: the 10 requests fed
    assert (batch.cancelled, batch.unfed_cancelled, batch.feed_closed) == (23, 13, 1)
    assert feed.feed(conn, batch_id) == 0 and conn.zscore(keys.feeding(), batch_id) is None

    resumed = submit(conn, tmp_path / "d.jsonl", resume=batch_id)
    batch = batches.get_batch(conn, batch_id)
    assert resumed.unfed == 13 and batch.status == "in_progress"
    assert (batch.cancelled, batch.unfed_cancelled, batch.feed_closed, batch.total) == (0, 0, 0, 23)
    assert queued_ids(conn, batch) == [batches.job_id(batch_id, f"r{i}") for i in range(10)]  # one job each
    assert batch.fed == 2  # the window is full again; the rest waits in storage, in place


def test_an_expired_batch_gives_its_unfed_requests_batch_expired_rows(tmp_path, redis_url, small_window):
    conn, batch_id = new_batch(tmp_path, redis_url, 23, completion_window="1h")
    conn.hset(keys.batch(batch_id), "expires_at", "1")  # its window has passed
    expiry.expire(conn, batch_id)
    batch = batches.get_batch(conn, batch_id)
    assert (batch.status, batch.expired) == ("expired", 23)
    table, _ = results.collect(conn, batch_id)
    assert table["custom_id"].to_pylist() == [f"r{i}" for i in range(23)]  # at their lines, in file order
    assert table["line"].to_pylist() == list(range(1, 24))
    assert set(table["error_code"].to_pylist()) == {"batch_expired"}


def test_a_worker_tops_up_the_queue_and_runs_a_batch_bigger_than_its_window(
    tmp_path, redis_url, tiny_model, small_window
):
    conn, batch_id = new_batch(tmp_path, redis_url, 23, model=tiny_model)
    BatchWorker(
        [queue_for(tiny_model)],
        connection=conn,
        serializer=JSONSerializer,
        model=tiny_model,
        flush_rows=4,
        engine_options={"kv_cache_memory": "4MiB", "max_num_seqs": 2},
    ).work(burst=True)
    batch = batches.get_batch(conn, batch_id)
    assert (batch.status, batch.completed, batch.fed) == ("completed", 23, 5)
    rows = pq.read_table(tmp_path / "out" / batch_id).to_pylist()  # the stored requests are no part of it
    assert sorted(r["custom_id"] for r in rows) == sorted(f"r{i}" for i in range(23))


def test_stored_requests_that_cannot_be_read_are_said_and_the_feeder_goes_on(tmp_path, redis_url, small_window):
    conn, batch_id = new_batch(tmp_path, redis_url, 23)
    (tmp_path / "out" / batch_id / "_requests" / "0000002.jsonl").unlink()  # the storage lost a chunk
    conn.delete(Queue(batches.get_batch(conn, batch_id).queue, connection=conn).key)
    said: list[str] = []
    assert feed.top_up(conn, log=said.append) == 0
    assert len(said) == 1 and said[0].startswith(f"Cannot read chunk 2 of batch {batch_id}'s stored requests at ")
    assert batches.get_batch(conn, batch_id).fed == 2  # nothing skipped: a feeder that can read it writes it


def test_miro_status_says_how_much_of_a_batch_is_stored_and_queued(tmp_path, redis_url, small_window):
    from click.testing import CliRunner

    from miro.cli.main import cli

    conn, batch_id = new_batch(tmp_path, redis_url, 23)
    shown = CliRunner().invoke(cli, ["status", batch_id, "--redis-url", redis_url])
    assert shown.exit_code == 0 and "23 requests, 10 of them queued so far" in shown.output, shown.output
    control.cancel(conn, batch_id)
    shown = CliRunner().invoke(cli, ["status", batch_id, "--redis-url", redis_url])
    assert "23 requests, 10 of them queued so far, 13 never queued" in shown.output, shown.output
