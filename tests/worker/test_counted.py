"""miro.worker.fleet.lifecycle.counted: an ended batch's counted set moves to storage, so Redis keeps nothing a request for its
TTL, and comes back for what runs the batch again; exactly-once counting holds throughout (real redis-server)."""

import json

import redis

from miro.worker.fleet.records import batches, keys, scripts
from miro.worker.fleet.lifecycle import control, counted, release
from miro.worker.fleet.intake.submit import submit


def _batch(tmp_path, conn, n: int = 5, **options) -> str:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "prompt": "hi", "max_tokens": 2}) + "\n" for i in range(n)))
    return submit(conn, path, output=str(tmp_path / "out"), **options).batch_id


def _complete(conn, batch_id: str, custom_ids: list[str]) -> None:
    """What the workers do: count each request completed (the last count settles the batch), then the release."""
    for custom_id in custom_ids:
        batches.count_finished(conn, batch_id, custom_id, prompt_tokens=3, completion_tokens=2)
    release.release_if_ended(conn, batch_id)


def test_an_ended_batchs_counted_set_goes_to_storage_and_a_late_duplicate_counts_nothing(tmp_path, redis_server):
    conn = redis.Redis.from_url(redis_server)
    ids = [f"r{i}" for i in range(5)] + ['odd "id"\n, é ✓']  # any text comes back as it was
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": cid, "prompt": "hi"}) + "\n" for cid in ids))
    batch_id = submit(conn, path, output=str(tmp_path / "out")).batch_id
    _complete(conn, batch_id, ids)
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.prompt_tokens) == ("completed", 6, 18)
    assert not conn.exists(keys.batch_counted(batch_id))  # no byte a request left in Redis
    stored = (tmp_path / "out" / batch_id / counted.FILE).read_text().splitlines()
    assert sorted(json.loads(line) for line in stored) == sorted(ids)
    assert counted.were_counted(conn, batch_id, ["r0", "never-seen"]) == [True, True]

    # a job run again after its worker's heartbeat lapsed counts nothing, in COUNT and in a cancel's sweep
    assert batches.count_finished(conn, batch_id, "r1", prompt_tokens=3, completion_tokens=2) == 6
    record = batches.get_batch(conn, batch_id)
    assert (record.completed, record.prompt_tokens) == (6, 18)

    # a retry or resume brings it back first, with the batch's TTL; the next end moves it again
    assert counted.restore(conn, record) == 6
    assert sorted(m.decode("utf-8", "surrogateescape") for m in conn.smembers(keys.batch_counted(batch_id))) == sorted(
        ids
    )
    assert 0 < conn.ttl(keys.batch_counted(batch_id)) <= conn.ttl(keys.batch(batch_id))
    assert batches.count_finished(conn, batch_id, "r1", prompt_tokens=3, completion_tokens=2) == 6  # still once
    assert batches.get_batch(conn, batch_id).completed == 6
    assert not counted.store(conn, batches.get_batch(conn, batch_id))  # pinned: a release keeps it in Redis


def test_store_refuses_a_running_batch_and_a_set_that_changed(tmp_path, redis_server):
    conn = redis.Redis.from_url(redis_server)
    batch_id = _batch(tmp_path, conn)
    batches.count_finished(conn, batch_id, "r0", prompt_tokens=1, completion_tokens=1)
    assert not counted.store(conn, batches.get_batch(conn, batch_id))  # in progress
    assert conn.scard(keys.batch_counted(batch_id)) == 1
    for i in range(1, 5):
        batches.count_finished(conn, batch_id, f"r{i}", prompt_tokens=1, completion_tokens=1)
    record = batches.get_batch(conn, batch_id)
    assert record.status == "completed"
    ended = [record.status]
    assert scripts.STORE_COUNTED(conn, [keys.batch(batch_id), keys.batch_counted(batch_id)], [4, *ended]) == 0
    assert conn.scard(keys.batch_counted(batch_id)) == 5  # a size other than what was written: kept
    assert counted.store(conn, record)
    assert not counted.store(conn, record)  # stored once


def test_resume_of_a_cancelled_batch_runs_exactly_what_never_ran(tmp_path, redis_server):
    """A cancelled batch's counted set is in storage; --resume brings it back and runs only the requests without a
    finished run, each counted once when it does."""
    conn = redis.Redis.from_url(redis_server)
    batch_id = _batch(tmp_path, conn, n=6, requests_per_job=1)
    control.cancel(conn, batch_id)
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.cancelled) == ("cancelled", 0, 6)
    release.release_if_ended(conn, batch_id)
    assert not conn.exists(keys.batch_counted(batch_id)) and conn.hget(keys.batch(batch_id), "counted_stored")
    resumed = submit(conn, tmp_path / "in.jsonl", resume=batch_id)
    assert resumed.enqueued == 6  # counted (cancelled) and without a row: each runs again
    assert conn.hget(keys.batch(batch_id), "counted_stored") is None
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.cancelled) == ("in_progress", 0, 0)
    _complete(conn, batch_id, [f"r{i}" for i in range(6)] + ["r3"])
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.cancelled, record.total) == ("completed", 6, 0, 6)
    assert not conn.exists(keys.batch_counted(batch_id))  # ended again: moved again
