"""Watching and steering a fleet: worker hashes, the batch lifecycle, cancel, retry (the metrics port, start-up and
the jobs RQ gives up on: test_fleet_worker.py). Real redis-server, real `miro worker` processes on a tiny GGUF
model."""

import signal
import socket
import time

import pyarrow.parquet as pq
import pytest
import redis
from click.testing import CliRunner
from fleet_processes import long_lines, rows_written, run_worker, stop, submit, worker_process
from gguf_factory import write_tiny_llama
from polling import wait_for
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from miro.cli.main import cli
from miro.worker.fleet.records import batches, keys, workers
from miro.worker.fleet.intake.routing import model_name, queue_for, worker_queues
from miro.worker.fleet.output.results import read_parts

LIFECYCLE = ["validating", "in_progress", "finalizing", "completed"]


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory):
    """A tiny model with room for requests that outlast the worker's once-a-second checks."""
    path = tmp_path_factory.mktemp("m") / "tiny-8k.gguf"
    return str(write_tiny_llama(path, tensor_type="Q8_0", context_length=8192)["path"])


# ---- worker hashes and the batch lifecycle ------------------------------------------------------------


REQUESTS = 1200  # enough for several seconds of work on a quiet machine: a worker publishes once a second


def test_two_workers_publish_kv_figures_and_the_batch_walks_the_lifecycle(tmp_path, redis_url, tiny_model):
    conn = redis.Redis.from_url(redis_url)
    lines = [
        {"id": f"p{i}", "prompt": f"hello {i}", "max_tokens": 40 + 37 * i % 80, "ignore_eos": True}
        for i in range(REQUESTS)
    ]  # lengths vary, as in real batches: requests do not finish in lockstep
    batch_id = submit(tmp_path, redis_url, tiny_model, lines)
    procs = {name: worker_process(redis_url, tiny_model, "--burst", "--name", name) for name in ("w1", "w2")}
    samples: dict[str, list[dict]] = {"w1": [], "w2": []}
    statuses = [batches.get_batch(conn, batch_id).status]
    running = True
    while running:
        running = any(p.poll() is None for p in procs.values())  # one more look after both have exited
        for record in workers.list_workers(conn):
            samples[record.name].append(record)
        status = batches.get_batch(conn, batch_id).status
        if status != statuses[-1]:
            statuses.append(status)
        time.sleep(0.2 if running else 0)
    assert all(p.returncode == 0 for p in procs.values())

    for name, seen in samples.items():
        assert len(seen) >= 3, f"{name} was hardly ever seen"
        for s in seen:
            assert (s.pid, s.host, s.model, s.queues) == (
                procs[name].pid,
                socket.gethostname(),
                model_name(tiny_model),
                worker_queues([queue_for(tiny_model)]),
            )
            assert 0 <= s.stats.kv_blocks_used <= s.stats.kv_blocks_total and s.stats.kv_blocks_total > 0
            assert s.stats.kv_usage == pytest.approx(s.stats.kv_blocks_used / s.stats.kv_blocks_total)
            # a worker takes a whole group job once it has a free seat: what its 4 seats cannot run yet waits
            assert 0 <= s.stats.running <= 4 and s.stats.running + s.stats.waiting <= s.in_flight
            assert s.updated_at >= s.started_at and s.state in ("idle", "busy")
        assert len({s.stats.kv_blocks_used for s in seen}) >= 2, f"{name}'s KV figures never moved"
        done = [s.jobs_done for s in seen]
        assert done == sorted(done) and done[-1] > done[0]
        assert seen[-1].stats.generation_tokens_total > seen[0].stats.generation_tokens_total
    assert workers.list_workers(conn) == []  # a worker that stops removes its hash

    record = batches.get_batch(conn, batch_id)
    assert statuses[0] == "in_progress" and statuses[-1] == "completed"
    assert [s for s in LIFECYCLE if s in statuses] == statuses  # in order, none foreign
    stamps = [record.at(s) for s in LIFECYCLE]
    assert record.created_at <= stamps[0] and stamps == sorted(stamps)
    assert record.completed + record.failed + record.cancelled == record.total == REQUESTS
    assert (record.completed, record.completion_tokens) == (REQUESTS, sum(line["max_tokens"] for line in lines))


def test_a_killed_workers_hash_expires_within_seconds(redis_url, tiny_model):
    conn = redis.Redis.from_url(redis_url)
    proc = worker_process(redis_url, tiny_model, "--name", "doomed")
    try:
        assert wait_for(lambda: workers.get_worker(conn, "doomed") is not None), "the worker never showed"
        assert 0 < conn.ttl(keys.worker("doomed")) <= workers.TTL_S
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert workers.get_worker(conn, "doomed") is not None  # nobody removed it: it expires (TTL checked above)
        assert wait_for(lambda: workers.get_worker(conn, "doomed") is None, timeout_s=workers.TTL_S + 30)
    finally:
        stop(proc)


# ---- cancel -------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("one_request_per_job")  # it follows one request's RQ job
def test_cancel_mid_batch_aborts_in_flight_and_writes_nothing_after(tmp_path, redis_url, long_context_model):
    conn = redis.Redis.from_url(redis_url)
    lines = [
        {"id": f"p{i}", "prompt": f"hello {i}", "max_tokens": 20 if i < 4 else 6000, "ignore_eos": True}
        for i in range(40)
    ]  # four quick requests, then long ones (seconds each) in flight at the cancel
    batch_id = submit(tmp_path, redis_url, long_context_model, lines)
    proc = worker_process(redis_url, long_context_model, "--name", "w", "--kv-cache-memory", "64MiB")
    try:
        assert wait_for(lambda: batches.get_batch(conn, batch_id).completed >= 4), "the worker did no work"
        assert wait_for(lambda: (w := workers.get_worker(conn, "w")) is not None and w.stats.running > 0)
        cancelled = CliRunner().invoke(cli, ["cancel", batch_id, "--redis-url", redis_url])
        assert cancelled.exit_code == 0, cancelled.output
        assert cancelled.stdout == "cancelled\n"

        record = batches.get_batch(conn, batch_id)
        assert record.status == "cancelled" and record.at("cancelled") >= record.at("cancelling")
        assert record.completed == 4 and record.cancelled == 36
        assert record.completed + record.failed + record.cancelled == record.total == 40
        queue = Queue(queue_for(long_context_model), connection=conn, serializer=JSONSerializer)
        assert queue.count == 0
        # ended: its finished and cancelled jobs' keys are gone (release.py)
        assert not any(conn.exists(Job.key_for(batches.job_id(batch_id, f"p{i}"))) for i in range(40))
        assert len(queue.canceled_job_registry) == len(queue.finished_job_registry) == 0
        assert wait_for(lambda: workers.get_worker(conn, "w").jobs_cancelled == 4)  # the long ones it held
        assert workers.get_worker(conn, "w").stats.running == 0

        rows = rows_written(tmp_path, batch_id)
        assert rows == record.completed
        time.sleep(2)  # the worker keeps running: nothing more of the batch is written or counted
        assert rows_written(tmp_path, batch_id) == rows
        assert batches.get_batch(conn, batch_id) == record

        later = submit(tmp_path, redis_url, long_context_model, long_lines(2, max_tokens=3), name="later.jsonl")
        assert wait_for(lambda: batches.get_batch(conn, later).status == "completed"), "the worker stopped serving"
    finally:
        stop(proc)
    assert proc.returncode == 0

    again = CliRunner().invoke(cli, ["cancel", batch_id, "--redis-url", redis_url])
    assert again.exit_code == 0 and "already cancelled" in again.stderr
    finished = CliRunner().invoke(cli, ["cancel", later, "--redis-url", redis_url])
    assert finished.exit_code == 1
    assert finished.output == f"Error: Batch {later} is completed; there is nothing left to cancel.\n"


@pytest.mark.usefixtures("one_request_per_job")  # it follows one request's RQ job
def test_cancel_without_workers_settles_at_once_and_resume_undoes_it(tmp_path, redis_url, tiny_model):
    conn = redis.Redis.from_url(redis_url)
    other = submit(tmp_path, redis_url, tiny_model, long_lines(3), name="other.jsonl")
    batch_id = submit(tmp_path, redis_url, tiny_model, long_lines(5))
    result = CliRunner().invoke(cli, ["cancel", batch_id, "--redis-url", redis_url, "--wait", "0"])
    assert result.exit_code == 0 and result.stdout == "cancelled\n"
    assert "5 queued jobs removed" in result.stderr
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.cancelled, record.total) == ("cancelled", 5, 5)
    queue = Queue(queue_for(tiny_model), connection=conn, serializer=JSONSerializer)
    assert queue.job_ids == [batches.job_id(other, f"p{i}") for i in range(3)]  # the other batch keeps its place

    resumed = CliRunner().invoke(
        cli, ["submit", str(tmp_path / "d.jsonl"), "--redis-url", redis_url, "--resume", batch_id]
    )
    assert resumed.exit_code == 0, resumed.output
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.cancelled, record.total) == ("in_progress", 0, 5)
    assert queue.count == 8


def test_cancel_and_retry_of_an_unknown_batch_are_one_sentence(redis_url):
    for command in ("cancel", "retry"):
        result = CliRunner().invoke(cli, [command, "batch_nope", "--redis-url", redis_url])
        assert result.exit_code == 1 and result.output == "Error: There is no batch 'batch_nope' on this Redis.\n"


# ---- retry --------------------------------------------------------------------------------------------


def test_retry_reruns_exactly_the_failed_requests(tmp_path, redis_url, tiny_model):
    conn = redis.Redis.from_url(redis_url)
    lines = [{"id": f"s{i}", "prompt": f"hello {i}", "max_tokens": 8, "temperature": 0} for i in range(5)]
    lines += [{"id": f"l{i}", "prompt": "hello " * (20 + i), "max_tokens": 8, "temperature": 0} for i in range(3)]
    batch_id = submit(tmp_path, redis_url, tiny_model, lines)
    run_worker(conn, tiny_model, max_model_len=32)  # the long prompts do not fit this worker
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.failed) == ("completed", 5, 3)

    retried = CliRunner().invoke(cli, ["retry", batch_id, "--redis-url", redis_url])
    assert retried.exit_code == 0, retried.output
    assert retried.stdout == "3\n"
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.failed) == ("in_progress", 5, 0)
    queue = Queue(queue_for(tiny_model), connection=conn, serializer=JSONSerializer)
    assert sorted(queue.job_ids) == sorted(batches.job_id(batch_id, f"l{i}") for i in range(3))
    assert len(queue.failed_job_registry) == 0

    run_worker(conn, tiny_model)  # room for them now
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.failed) == ("completed", 8, 0)
    runs = {}
    for row in read_parts(str(tmp_path / "out"), batch_id).to_pylist():
        runs.setdefault(row["custom_id"], []).append(row["error"] is None)
    # each failed request ran once more (an error row, then a result); the successful ones did not run again
    assert {cid: sorted(ok) for cid, ok in runs.items()} == {
        **{f"s{i}": [True] for i in range(5)},
        **{f"l{i}": [False, True] for i in range(3)},
    }

    merged = CliRunner().invoke(cli, ["results", batch_id, "-o", str(tmp_path / "m.parquet"), "--redis-url", redis_url])
    assert merged.exit_code == 0
    assert all(r["error"] is None for r in pq.read_table(tmp_path / "m.parquet").to_pylist())

    nothing = CliRunner().invoke(cli, ["retry", batch_id, "--redis-url", redis_url])
    assert nothing.exit_code == 0 and nothing.stdout == "0\n"
    assert batches.get_batch(conn, batch_id).status == "completed"
