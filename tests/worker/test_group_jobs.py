"""Group jobs on a real redis-server with real BatchWorkers on a tiny GGUF model: the feeder puts several requests in
one RQ job, and each request is still counted once. A group run again skips what was counted, a request of a group
that fails gets a failed job of its own that `miro retry` runs alone, RQ giving up on a group fails each request it
left, a cancel counts a group's requests, and `--resume` leaves a queued group's requests to it."""

import json

import pyarrow.parquet as pq
import redis
from rq import Queue
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer

from miro.worker import BatchWorker
from miro.worker.fleet.records import batches
from miro.worker.fleet.lifecycle import control, counted
from miro.worker.process.jobs import GAVE_UP
from miro.worker.fleet.intake.routing import queue_for
from miro.worker.fleet.intake.submit import submit


def new_batch(tmp_path, conn, model, lines, per_job: int) -> str:
    dataset = tmp_path / "d.jsonl"
    dataset.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return submit(conn, dataset, model=model, output=str(tmp_path / "out"), requests_per_job=per_job).batch_id


def short(n: int) -> list[dict]:
    return [{"id": f"r{i}", "prompt": f"hello {i}", "max_tokens": 2, "temperature": 0} for i in range(n)]


def worker(conn, model) -> BatchWorker:
    return BatchWorker(
        [queue_for(model)],
        connection=conn,
        serializer=JSONSerializer,
        model=model,
        flush_rows=2,
        engine_options={"kv_cache_memory": "4MiB", "max_num_seqs": 3},
    )


def rows(tmp_path, batch_id) -> list[dict]:
    return pq.read_table(tmp_path / "out" / batch_id).to_pylist()


def queue(conn, model) -> Queue:
    return Queue(queue_for(model), connection=conn, serializer=JSONSerializer)


def test_a_group_runs_its_requests_and_a_refused_one_gets_a_failed_job_that_retry_runs_alone(
    tmp_path, redis_url, tiny_model
):
    conn = redis.Redis.from_url(redis_url)
    lines = [*short(4), {"id": "long", "prompt": "hello " * 200, "max_tokens": 4}]  # over the 128-token context
    batch_id = new_batch(tmp_path, conn, tiny_model, lines, per_job=5)
    assert queue(conn, tiny_model).job_ids == [batches.group_job_id(batch_id, 0, 0)]
    worker(conn, tiny_model).work(burst=True)
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.failed) == ("completed", 4, 1)
    assert sorted(r["custom_id"] for r in rows(tmp_path, batch_id)) == ["long", "r0", "r1", "r2", "r3"]
    failed = FailedJobRegistry(queue=queue(conn, tiny_model))
    own = batches.job_id(batch_id, "long")
    assert failed.get_job_ids() == [own]  # the request's own job, not the group's: the group finished
    assert Job.fetch(own, connection=conn, serializer=JSONSerializer).kwargs["prompt"] == "hello " * 200

    assert control.retry(conn, batch_id).enqueued == 1
    assert queue(conn, tiny_model).job_ids == [own]
    assert batches.get_batch(conn, batch_id).failed == 0
    worker(conn, tiny_model).work(burst=True)  # still too long: it fails again, alone, and is counted once
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.failed) == ("completed", 4, 1)


def test_a_group_run_again_skips_the_requests_already_counted(tmp_path, redis_url, tiny_model):
    conn = redis.Redis.from_url(redis_url)
    batch_id = new_batch(tmp_path, conn, tiny_model, short(4), per_job=4)
    for custom_id in ("r0", "r1"):  # a worker that died had written and counted these two
        batches.count_finished(conn, batch_id, custom_id, prompt_tokens=3, completion_tokens=2)
    worker(conn, tiny_model).work(burst=True)
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed) == ("completed", 4)
    assert sorted(r["custom_id"] for r in rows(tmp_path, batch_id)) == ["r2", "r3"]


def test_rq_giving_up_on_a_group_fails_each_request_it_left_on_its_own(tmp_path, redis_url, tiny_model):
    conn = redis.Redis.from_url(redis_url)
    batch_id = new_batch(tmp_path, conn, tiny_model, short(3), per_job=3)
    batches.count_finished(conn, batch_id, "r0", prompt_tokens=3, completion_tokens=2)
    group = Job.fetch(batches.group_job_id(batch_id, 0, 0), connection=conn, serializer=JSONSerializer)
    queue(conn, tiny_model).remove(group)  # as RQ's clean-up leaves a job whose workers died too often
    group.set_status(JobStatus.FAILED)
    failed = FailedJobRegistry(queue=queue(conn, tiny_model))
    failed.add(group, ttl=100)

    worker(conn, tiny_model).run_maintenance_tasks()
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.failed) == ("completed", 1, 2)
    assert sorted(failed.get_job_ids()) == sorted(batches.job_id(batch_id, c) for c in ("r1", "r2"))
    assert not conn.exists(group.key)
    assert {r["custom_id"]: r["error"] for r in rows(tmp_path, batch_id)} == {"r1": GAVE_UP, "r2": GAVE_UP}


def test_a_cancel_counts_each_request_of_a_group_once(tmp_path, redis_url, tiny_model):
    conn = redis.Redis.from_url(redis_url)
    queued = new_batch(tmp_path, conn, tiny_model, short(7), per_job=3)
    assert control.cancel(conn, queued).removed == 3  # jobs of 3, 3 and 1 requests
    record = batches.get_batch(conn, queued)
    assert (record.status, record.cancelled) == ("cancelled", 7)

    taken = new_batch(tmp_path, conn, tiny_model, short(5), per_job=3)
    batches.count_finished(conn, taken, "r0", prompt_tokens=3, completion_tokens=2)
    batches.set_status(conn, taken, "cancelling")  # cancelled after the workers read its status
    worker(conn, tiny_model).work(burst=True)  # takes each group, finds it cancelling: counts it, runs none
    record = batches.get_batch(conn, taken)
    assert (record.status, record.completed, record.cancelled) == ("cancelled", 1, 4)
    assert not (tmp_path / "out" / taken).exists() or rows(tmp_path, taken) == []


def test_resume_leaves_the_requests_of_a_queued_group_to_it(tmp_path, redis_url, tiny_model):
    conn = redis.Redis.from_url(redis_url)
    lines = short(4)
    batch_id = new_batch(tmp_path, conn, tiny_model, lines, per_job=2)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(line) + "\n" for line in [*lines, short(5)[4]]))
    resumed = submit(conn, tmp_path / "d.jsonl", resume=batch_id)
    assert (resumed.enqueued, resumed.in_flight) == (1, 4)  # only the new line: the others wait in their groups
    assert queue(conn, tiny_model).job_ids == [
        batches.group_job_id(batch_id, 0, 0),
        batches.group_job_id(batch_id, 0, 1),
        batches.job_id(batch_id, "r4"),
    ]
    worker(conn, tiny_model).work(burst=True)
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.total) == ("completed", 5, 5)
    assert sorted(r["custom_id"] for r in rows(tmp_path, batch_id)) == ["r0", "r1", "r2", "r3", "r4"]
    # each counted once; the ended batch's set has moved to storage (counted.py)
    assert sorted(
        json.loads(line) for line in (tmp_path / "out" / batch_id / counted.FILE).read_text().splitlines()
    ) == ["r0", "r1", "r2", "r3", "r4"]
