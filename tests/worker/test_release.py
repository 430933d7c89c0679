"""Once a batch ends, its finished and cancelled requests' RQ job keys go, whoever ended it (a worker, `miro cancel`,
expiry, a later sweep), while status, results, retry and --resume go on working: a real redis-server, the tiny
model through a BatchWorker."""

import json

import pytest
import redis
from click.testing import CliRunner
from rq import Queue
from rq.serializers import JSONSerializer

from miro.cli.main import cli
from miro.core import defaults
from miro.worker import BatchWorker
from miro.worker.fleet.records import batches, keys, scripts
from miro.worker.fleet.lifecycle import control, counted, expiry, release
from miro.worker.fleet.output import results
from miro.worker.fleet.intake.routing import queue_for
from miro.worker.fleet.intake.submit import submit

pytestmark = pytest.mark.usefixtures("one_request_per_job")  # they follow one request's RQ job


def write(tmp_path, lines, name="d.jsonl"):
    dataset = tmp_path / name
    dataset.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return dataset


def short(n: int) -> list[dict]:
    return [{"id": f"s{i}", "prompt": f"hello {i}", "max_tokens": 4, "temperature": 0} for i in range(n)]


def run_worker(conn, model, **options) -> BatchWorker:
    worker = BatchWorker(
        [Queue(queue_for(model), connection=conn, serializer=JSONSerializer)],
        connection=conn,
        serializer=JSONSerializer,
        model=model,
        engine_options={"kv_cache_memory": "4MiB", "max_num_seqs": 4, **options},
    )
    worker.work(burst=True, logging_level="WARNING")
    return worker


def rq_keys(conn, batch_id) -> list[str]:
    """RQ's keys of the batch's jobs (hashes, results) and the registry entries that name them."""
    found = sorted(k.decode() for k in conn.scan_iter(match=f"rq:*{batch_id}*", count=10_000))
    for registry in conn.scan_iter(match="rq:*:miro:*"):
        if conn.type(registry) == b"zset":
            found += [
                f"{registry.decode()} {m.decode()}"
                for m in conn.zrange(registry, 0, -1)
                if m.decode().startswith(batch_id)
            ]
    return found


def test_a_completed_batch_keeps_only_its_failed_jobs_and_status_results_and_retry_work(
    tmp_path, redis_url, tiny_model
):
    conn = redis.Redis.from_url(redis_url)
    lines = short(6) + [{"id": "long", "prompt": "hello " * 40, "max_tokens": 4}]
    batch_id = submit(conn, write(tmp_path, lines), model=tiny_model, output=str(tmp_path / "out")).batch_id
    assert len(rq_keys(conn, batch_id)) == 7  # a hash per queued job
    run_worker(conn, tiny_model, max_model_len=32)  # the long prompt does not fit: it fails
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.failed) == ("completed", 6, 1)
    failed_job = batches.job_id(batch_id, "long")
    assert set(rq_keys(conn, batch_id)) == {
        f"rq:failed:{queue_for(tiny_model)} {failed_job}",
        f"rq:job:{failed_job}",
        f"rq:results:{failed_job}",
    }
    assert conn.zscore(keys.batch_releases(), batch_id) is None
    # what stays (record, counters, per-request index) goes by itself after BATCH_TTL_S
    ttls = [conn.ttl(key) for key in keys.batch_all(batch_id) if conn.exists(key)]
    assert len(ttls) == 1 and defaults.BATCH_TTL_S - 60 < ttls[0] <= defaults.BATCH_TTL_S  # the record
    # which requests were counted is in storage now, not in Redis (counted.py)
    assert not conn.exists(keys.batch_counted(batch_id)) and conn.hget(keys.batch(batch_id), "counted_stored")
    assert (tmp_path / "out" / batch_id / counted.FILE).read_text().count("\n") == 7

    status = CliRunner().invoke(cli, ["status", batch_id, "--redis-url", redis_url])
    assert status.exit_code == 0 and "7/7 done" in status.output, status.output
    table, _ = results.collect(conn, batch_id)
    assert sorted(table["custom_id"].to_pylist()) == sorted(line["id"] for line in lines)

    assert control.retry(conn, batch_id).enqueued == 1  # brings the counted set back first
    assert conn.scard(keys.batch_counted(batch_id)) == 6 and not conn.hget(keys.batch(batch_id), "counted_stored")
    run_worker(conn, tiny_model)  # room for the long prompt now
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.failed) == ("completed", 7, 0)
    assert rq_keys(conn, batch_id) == []
    resumed = submit(conn, write(tmp_path, lines), resume=batch_id)  # every request finished: nothing to run
    assert (resumed.enqueued, resumed.already_finished) == (0, 7)


def test_cancel_frees_the_jobs_and_resume_runs_exactly_the_unfinished_ones(tmp_path, redis_url, tiny_model):
    conn = redis.Redis.from_url(redis_url)
    dataset = write(tmp_path, short(10))
    batch_id = submit(conn, dataset, model=tiny_model, output=str(tmp_path / "out")).batch_id
    queue = Queue(queue_for(tiny_model), connection=conn, serializer=JSONSerializer)
    later = [conn.rpop(queue.key) for _ in range(6)][::-1]  # kept off the queue while a worker runs the first 4
    run_worker(conn, tiny_model)
    conn.rpush(queue.key, *later)
    assert (batches.get_batch(conn, batch_id).completed, queue.count) == (4, 6)

    cancelled = CliRunner().invoke(cli, ["cancel", batch_id, "--redis-url", redis_url, "--wait", "0"])
    assert cancelled.exit_code == 0 and cancelled.stdout == "cancelled\n", cancelled.output
    assert rq_keys(conn, batch_id) == []
    assert conn.llen(keys.batch_cancel_pending(batch_id)) == 0

    assert conn.ttl(keys.batch(batch_id)) > 0  # an ended batch's keys expire...
    resumed = submit(conn, dataset, resume=batch_id)
    assert (resumed.enqueued, resumed.already_finished, resumed.expired) == (6, 4, 0)
    assert [conn.ttl(key) for key in (keys.batch(batch_id), keys.batch_counted(batch_id))] == [
        -1,
        -1,
    ]  # ...not a running one's
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.cancelled, record.total) == ("in_progress", 4, 0, 10)
    run_worker(conn, tiny_model)
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.cancelled) == ("completed", 10, 0)
    assert rq_keys(conn, batch_id) == []
    assert results.collect(conn, batch_id)[0].num_rows == 10


def test_an_expired_batch_frees_its_jobs_and_still_gives_its_expired_rows(tmp_path, redis_url, tiny_model):
    conn = redis.Redis.from_url(redis_url)
    batch_id = submit(
        conn, write(tmp_path, short(5)), model=tiny_model, output=str(tmp_path / "out"), completion_window="1h"
    ).batch_id
    assert expiry.expire_due(conn, now=batches.get_batch(conn, batch_id).expires_at + 1) == [batch_id]
    assert batches.get_batch(conn, batch_id).status == "expired"
    assert rq_keys(conn, batch_id) == []
    table, _ = results.collect(conn, batch_id)
    assert table.num_rows == 5 and set(table["error_code"].to_pylist()) == {"batch_expired"}


def test_a_release_that_died_half_way_is_finished_by_a_later_sweep(tmp_path, redis_url, tiny_model):
    """A batch ended without its release (its releaser died, or RQ's own worker ended it), and half released."""
    conn = redis.Redis.from_url(redis_url)
    batch_id = submit(conn, write(tmp_path, short(30)), model=tiny_model, output=str(tmp_path / "out")).batch_id
    record = batches.get_batch(conn, batch_id)
    queue = Queue(record.queue, connection=conn, serializer=JSONSerializer)
    batches.set_status(conn, batch_id, "cancelling")  # what control.sweep does, but for the release at its end
    scripts.TAKE_OFF_QUEUE(conn, [queue.key, keys.batch_cancel_pending(batch_id)], [f"{batch_id}-"])
    pending = [
        keys.batch_cancel_pending(batch_id),
        queue.canceled_job_registry.key,
        keys.batch(batch_id),
        keys.batch_counted(batch_id),
    ]
    while scripts.CANCEL_PENDING(conn, pending, [100, 0, "rq:job:"]):
        pass
    batches.count_cancelled(conn, batch_id, [])
    assert batches.get_batch(conn, batch_id).status == "cancelled"
    ended_at = conn.zscore(keys.batch_releases(), batch_id)
    assert ended_at is not None and len(rq_keys(conn, batch_id)) == 60  # each job's hash and registry entry
    some = [batches.job_id(batch_id, f"s{i}") for i in range(10)]
    scripts.RELEASE_JOBS(conn, [], [*release._PREFIXES, *some])  # the releaser died after its first chunk
    assert len(rq_keys(conn, batch_id)) == 40

    assert release.release_stale(conn, now=ended_at + 1) == []  # its ender may still be at it
    assert release.release_stale(conn, now=ended_at + 60) == [batch_id]
    assert rq_keys(conn, batch_id) == []
    assert conn.zscore(keys.batch_releases(), batch_id) is None
    record = batches.get_batch(conn, batch_id)
    assert (record.cancelled, record.total) == (30, 30)  # counts kept
