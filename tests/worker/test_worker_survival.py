"""A worker survives what its jobs do (issue 37): a poisoned line fails alone and the worker and the innocent
requests beside it go on; an error in the engine itself fails the requests in flight once and the engine starts
afresh; RQ giving up on a group job that ran on a worker that died, once that worker's execution has expired,
fails the group's requests instead of the worker; a job whose data miro did not write fails alone. Real
redis-server, real BatchWorkers on the tiny GGUF model."""

import json
import time

import pyarrow.parquet as pq
import pytest
import redis
from rq import Queue
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

from miro.core import Engine, MiroError
from miro.worker import BatchWorker
from miro.worker.fleet.records import batches
from miro.worker.fleet.intake.routing import queue_for
from miro.worker.fleet.intake.submit import submit
from miro.worker.process.jobs import GAVE_UP

POISON = [  # the two lines of issue 37's finding 1 (a tiny model's vocabulary has 272 tokens)
    {"id": "stop-id", "prompt": "hello", "min_tokens": 1, "stop_token_ids": [49152], "max_tokens": 4},
    {"id": "grammar", "prompt": "hello", "max_tokens": 4, "structured_outputs": {"grammar": 'start: "a"{60000}'}},
]


def short(n: int, prefix: str = "r") -> list[dict]:
    return [{"id": f"{prefix}{i}", "prompt": f"hello {i}", "max_tokens": 3, "temperature": 0} for i in range(n)]


def new_batch(tmp_path, conn, model, lines, per_job: int = 32, name: str = "d") -> str:
    dataset = tmp_path / f"{name}.jsonl"
    dataset.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return submit(conn, dataset, model=model, output=str(tmp_path / "out"), requests_per_job=per_job).batch_id


def worker(conn, model, **options) -> BatchWorker:
    return BatchWorker(
        [queue_for(model)],
        connection=conn,
        serializer=JSONSerializer,
        model=model,
        flush_rows=2,
        engine_options={"kv_cache_memory": "4MiB", "max_num_seqs": 4, **options},
    )


def rows(tmp_path, batch_id) -> dict[str, dict]:
    return {r["custom_id"]: r for r in pq.read_table(tmp_path / "out" / batch_id).to_pylist()}


def test_the_poisoned_lines_fail_alone_and_the_worker_and_the_innocent_batch_go_on(
    tmp_path, redis_url, tiny_model, unchecked
):
    conn = redis.Redis.from_url(redis_url)
    innocent = new_batch(tmp_path, conn, tiny_model, short(4, "i"), name="innocent")
    poisoned = new_batch(tmp_path, conn, tiny_model, [*POISON, *short(2, "p")], name="poisoned")
    assert worker(conn, tiny_model).work(burst=True)  # returns: it did not die
    record = batches.get_batch(conn, innocent)
    assert (record.status, record.completed, record.failed) == ("completed", 4, 0)
    record = batches.get_batch(conn, poisoned)
    assert (record.status, record.completed, record.failed) == ("completed", 2, 2)
    errors = {cid: row["error"] for cid, row in rows(tmp_path, poisoned).items()}
    assert "IndexError" in errors["stop-id"] and "Too many items" in errors["grammar"]
    assert errors["p0"] is None and errors["p1"] is None
    # each failed request of the group has a failed job of its own, for `miro retry`
    failed = FailedJobRegistry(queue=Queue(queue_for(tiny_model), connection=conn, serializer=JSONSerializer))
    assert sorted(failed.get_job_ids()) == sorted(batches.job_id(poisoned, c) for c in ("stop-id", "grammar"))


def test_checked_the_stop_id_is_refused_by_the_engine_and_the_grammar_at_submit(tmp_path, redis_url, tiny_model):
    conn = redis.Redis.from_url(redis_url)
    batch_id = new_batch(tmp_path, conn, tiny_model, [POISON[0], *short(2)])
    worker(conn, tiny_model).work(burst=True)
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.failed) == ("completed", 2, 1)
    assert "outside the model's vocabulary" in rows(tmp_path, batch_id)["stop-id"]["error"]
    dataset = tmp_path / "g.jsonl"
    dataset.write_text(json.dumps(POISON[1]) + "\n")
    refused = []
    with pytest.raises(MiroError, match="1 of 1 lines is invalid"):
        submit(conn, dataset, model=tiny_model, output=str(tmp_path / "out"), on_line_error=refused.append)
    assert [e.message for e in refused] == [
        "line 1: structured_outputs.grammar cannot run: parser error: Too many items (limit 50000; ff_tokens); try "
        "avoiding single-byte/short lexemes."
    ]


def test_an_engine_error_fails_the_requests_in_flight_once_and_the_engine_starts_afresh(
    tmp_path, redis_url, tiny_model, monkeypatch
):
    conn = redis.Redis.from_url(redis_url)
    batch_id = new_batch(tmp_path, conn, tiny_model, short(10), per_job=2)
    w = worker(conn, tiny_model)
    engine = Engine.from_model(tiny_model, kv_cache_memory="4MiB", max_num_seqs=4)
    real_execute, calls, in_flight = engine.runner.execute, [], []

    def execute(batch):  # the forward pass fails once, on its third call: no request's fault
        calls.append(len(batch.seqs))
        if len(calls) == 3:
            in_flight.append(len(w.by_request))
            raise FloatingPointError("injected: the forward pass")
        return real_execute(batch)

    engine.runner.execute = execute
    monkeypatch.setattr(Engine, "from_model", classmethod(lambda cls, *args, **kwargs: engine))  # work() loads it
    assert w.work(burst=True)
    record = batches.get_batch(conn, batch_id)
    assert record.status == "completed" and record.completed + record.failed == 10
    errors = [r["error"] for r in rows(tmp_path, batch_id).values() if r["error"]]
    assert len(errors) == record.failed == in_flight[0] > 0  # the requests in flight then, failed once each
    assert all(
        e.startswith(
            "the engine failed in a step this request was part of, not on this request alone "
            "(FloatingPointError: injected: the forward pass)"
        )
        for e in errors
    )
    assert engine.block_manager.num_used_blocks == 0 and not engine.has_unfinished_requests()


def test_rq_giving_up_on_a_group_whose_dead_worker_s_execution_expired_fails_its_requests(
    tmp_path, redis_url, tiny_model
):
    """Finding 2: the group ran on a worker that died; its execution hash expired (the registry lists it 60 s
    longer); RQ's clean-up gave up on it. The next worker's maintenance fails its requests and goes on."""
    conn = redis.Redis.from_url(redis_url)
    batch_id = new_batch(tmp_path, conn, tiny_model, short(3), per_job=3)
    dead = worker(conn, tiny_model)
    dead.engine = Engine.from_model(tiny_model, kv_cache_memory="4MiB", max_num_seqs=4)
    dead._admit(block=False)
    dead._step()  # it ran: its requests are in its engine, the group started in RQ
    [flight] = dead.in_flight.values()
    group, execution = flight.job, flight.execution
    assert group.get_status() == JobStatus.STARTED and conn.exists(execution.key)
    # the worker dies here (nothing of it runs again); its execution's hash expires, as it does after its TTL
    conn.pexpire(execution.key, 1)
    time.sleep(0.05)
    assert not conn.exists(execution.key) and conn.zscore(f"rq:executions:{group.id}", execution.id) is not None
    # ... and RQ's clean-up finds the job abandoned with no retries left: as after its last worker died
    queue = Queue(queue_for(tiny_model), connection=conn, serializer=JSONSerializer)
    conn.hset(group.key, "retries_left", 0)
    started = StartedJobRegistry(queue=queue)
    conn.zadd(started.key, {execution.composite_key: time.time() - 1}, xx=True)

    survivor = worker(conn, tiny_model)
    survivor.run_maintenance_tasks()
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.failed) == ("completed", 0, 3)
    assert {cid: r["error"] for cid, r in rows(tmp_path, batch_id).items()} == dict.fromkeys(
        ["r0", "r1", "r2"], GAVE_UP
    )
    assert not conn.exists(group.key)
    failed = FailedJobRegistry(queue=queue)
    assert sorted(failed.get_job_ids()) == sorted(batches.job_id(batch_id, c) for c in ("r0", "r1", "r2"))
    assert Execution(id=execution.id, job_id=group.id, connection=conn).key == execution.key


def test_a_job_whose_data_miro_did_not_write_fails_alone(tmp_path, redis_url, tiny_model):
    conn = redis.Redis.from_url(redis_url)
    queue = Queue(queue_for(tiny_model), connection=conn, serializer=JSONSerializer)
    odd = queue.enqueue("miro.worker.jobs.generate", kwargs={"requests": [{"batch_id": 7}]}, job_id="odd")
    batch_id = new_batch(tmp_path, conn, tiny_model, short(3), per_job=1)
    assert worker(conn, tiny_model).work(burst=True)
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed) == ("completed", 3)
    assert Job.fetch(odd.id, connection=conn, serializer=JSONSerializer).get_status() == JobStatus.FAILED


def test_a_group_run_again_after_its_worker_died_is_split_so_a_killer_is_quarantined_alone(
    tmp_path, redis_url, tiny_model
):
    """A group whose worker died (retries left) comes back from RQ's clean-up; the worker that takes it queues each
    request not yet counted as a job of its own, with the group's retries left, and finishes the group. Those jobs
    then run (or, one that kills its workers again, is quarantined alone: QUARANTINE_AFTER deaths in all)."""
    from miro.worker.fleet.intake.job_writer import ABANDONED_RETRIES, QUARANTINE_AFTER

    assert ABANDONED_RETRIES == QUARANTINE_AFTER - 1
    conn = redis.Redis.from_url(redis_url)
    batch_id = new_batch(tmp_path, conn, tiny_model, short(3), per_job=3)
    batches.count_finished(conn, batch_id, "r0", prompt_tokens=3, completion_tokens=2)  # the dead worker did r0
    queue = Queue(queue_for(tiny_model), connection=conn, serializer=JSONSerializer)
    group_id = batches.group_job_id(batch_id, 0, 0)
    assert Job.fetch(group_id, connection=conn, serializer=JSONSerializer).retries_left == ABANDONED_RETRIES
    dead = worker(conn, tiny_model)
    dead.engine = Engine.from_model(tiny_model, kv_cache_memory="4MiB", max_num_seqs=4)
    dead._admit(block=False)  # ... and dies holding the group: its heartbeat lapses
    started = StartedJobRegistry(queue=queue)
    for entry in conn.zrange(started.key, 0, -1):
        conn.zadd(started.key, {entry: 1})

    survivor = worker(conn, tiny_model)
    survivor.run_maintenance_tasks()  # RQ queues the group again, one retry fewer
    group = Job.fetch(group_id, connection=conn, serializer=JSONSerializer)
    assert group.get_status() == JobStatus.QUEUED and group.retries_left == ABANDONED_RETRIES - 1
    assert survivor.work(burst=True)  # it takes the group: split into a job per request, which it then runs
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.failed) == ("completed", 3, 0)
    assert {cid: r["job_id"] for cid, r in rows(tmp_path, batch_id).items()} == {
        cid: batches.job_id(batch_id, cid) for cid in ("r1", "r2")
    }
