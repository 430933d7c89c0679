"""A BatchWorker never runs a finished request twice, enforces job timeouts, refuses what can never fit and
stops within its grace period. Real redis-server, real `miro worker` processes on tiny GGUF models."""

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
import redis
from click.testing import CliRunner
from gguf_factory import write_tiny_llama
from polling import kill_one_of_two_workers, wait_for
from rq import Queue
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from miro.cli.main import cli
from miro.worker import BatchWorker
from miro.worker.fleet.records import batches
from miro.worker.fleet.output.results import read_parts
from miro.worker.fleet.intake.routing import queue_for

pytestmark = pytest.mark.usefixtures("one_request_per_job")  # they follow one request's RQ job

SHORT_INTERVALS = ("--job-monitoring-interval", "1", "--heartbeat-slack", "2", "--maintenance-interval", "1")


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory):
    """A tiny model with room for requests that take many seconds (tens of thousands of tokens)."""
    path = tmp_path_factory.mktemp("m") / "tiny-64k.gguf"
    return str(write_tiny_llama(path, tensor_type="Q8_0", context_length=65536)["path"])


def submit(tmp_path, redis_url, model, lines, *extra) -> str:
    dataset = tmp_path / "d.jsonl"
    dataset.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = CliRunner().invoke(
        cli,
        ["submit", str(dataset), "--redis-url", redis_url, "--model", model, "--output", str(tmp_path / "out"), *extra],
    )
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


def worker_command(redis_url, model, *extra) -> tuple[list[str], dict]:
    """`miro worker` as its own process, one thread each (two workers share 2 cores), and its env."""
    command = [
        sys.executable,
        "-c",
        "from miro.cli.main import cli; cli()",
        "worker",
        "--redis-url",
        redis_url,
        "--model",
        model,
        "--kv-cache-memory",
        "8MiB",
        "--max-num-seqs",
        "4",
        *extra,
    ]
    return command, {**os.environ, "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}


def run_worker(conn, model, kv_cache_memory: str) -> BatchWorker:
    """A BatchWorker in this process, in burst mode, on the model's queue; each row written at once."""
    worker = BatchWorker(
        [Queue(queue_for(model), connection=conn, serializer=JSONSerializer)],
        connection=conn,
        serializer=JSONSerializer,
        model=model,
        flush_rows=1,
        engine_options={"kv_cache_memory": kv_cache_memory, "max_num_seqs": 4},
    )
    worker.work(burst=True, logging_level="WARNING")
    return worker


def runs_per_request(tmp_path, batch_id) -> dict[str, int]:
    """How many rows each custom id has in the part files: one per run of its request."""
    runs: dict[str, int] = {}
    for row in read_parts(str(tmp_path / "out"), batch_id).to_pylist():
        runs[row["custom_id"]] = runs.get(row["custom_id"], 0) + 1
    return runs


# ---- heartbeats cover every job the worker holds ------------------------------------------------------


@pytest.mark.slow
def test_finished_jobs_waiting_for_their_flush_keep_their_heartbeat(tmp_path, redis_url, long_context_model):
    """Short requests finish at once, but two long ones keep the worker busy, so their rows wait 6 s for the part
    file: twice the 3 s a job's heartbeat lives, with maintenance every second. No finished request may be
    queued again, so every request runs exactly once."""
    lines = [{"id": f"p{i}", "prompt": f"hello {i}", "max_tokens": 20, "ignore_eos": True} for i in range(22)]
    lines += [{"id": f"long{i}", "prompt": "hello", "max_tokens": 20000, "ignore_eos": True} for i in range(2)]
    batch_id = submit(tmp_path, redis_url, long_context_model, lines)
    command, env = worker_command(
        redis_url,
        long_context_model,
        *SHORT_INTERVALS,
        "--kv-cache-memory",
        "48MiB",
        "--flush-rows",
        "1000",
        "--flush-seconds",
        "6",
        "--burst",
    )
    started = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started > 8, "the long requests were too short to keep finished rows waiting"
    record = batches.get_batch(redis.Redis.from_url(redis_url), batch_id)
    assert (record.status, record.completed, record.failed) == ("completed", 24, 0)
    assert runs_per_request(tmp_path, batch_id) == {line["id"]: 1 for line in lines}


@pytest.mark.slow
def test_short_intervals_and_a_kill_count_every_request_completed_once(tmp_path, redis_url, long_context_model):
    """Two workers with short intervals and slow flushes; one is killed mid-batch. Requests the killed worker
    held run again on the other, and nothing that succeeded is counted failed or counted twice."""
    lines = [{"id": f"p{i}", "prompt": f"hello {i}", "max_tokens": 150, "ignore_eos": True} for i in range(24)]
    batch_id = submit(tmp_path, redis_url, long_context_model, lines)
    conn = redis.Redis.from_url(redis_url)
    command, env = worker_command(
        redis_url, long_context_model, *SHORT_INTERVALS, "--flush-rows", "4", "--flush-seconds", "6"
    )
    kill_one_of_two_workers(
        command,
        env,
        lambda: batches.get_batch(conn, batch_id).completed,
        lambda: batches.get_batch(conn, batch_id).status == "completed",
    )
    record = batches.get_batch(conn, batch_id)
    assert (record.completed, record.failed) == (24, 0)
    assert set(runs_per_request(tmp_path, batch_id)) == {f"p{i}" for i in range(24)}
    merged = CliRunner().invoke(cli, ["results", batch_id, "-o", str(tmp_path / "m.parquet"), "--redis-url", redis_url])
    assert merged.exit_code == 0, merged.output
    rows = pq.read_table(tmp_path / "m.parquet").to_pylist()
    assert sorted(r["custom_id"] for r in rows) == sorted(f"p{i}" for i in range(24))
    assert all(r["error"] is None and len(r["output_token_ids"]) == 150 for r in rows)


# ---- job timeouts -------------------------------------------------------------------------------------


def test_a_job_past_its_timeout_is_aborted_and_its_neighbours_are_untouched(tmp_path, redis_url, long_context_model):
    lines = [{"id": "endless", "prompt": "hello", "max_tokens": 60000, "ignore_eos": True}]
    lines += [{"id": f"s{i}", "prompt": f"hi {i}", "max_tokens": 6, "ignore_eos": True} for i in range(3)]
    batch_id = submit(tmp_path, redis_url, long_context_model, lines, "--job-timeout", "2")
    conn = redis.Redis.from_url(redis_url)
    worker = run_worker(conn, long_context_model, "64MiB")

    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.failed) == ("completed", 3, 1)
    endless = Job.fetch(batches.job_id(batch_id, "endless"), connection=conn, serializer=JSONSerializer)
    assert endless.get_status() == JobStatus.FAILED and endless.retries_left == 0
    rows = {r["custom_id"]: r for r in read_parts(str(tmp_path / "out"), batch_id).to_pylist()}
    assert rows["endless"]["error"] == "timed out after 2 s"
    assert rows["endless"]["latency_s"] >= 2
    assert all(rows[f"s{i}"]["error"] is None and len(rows[f"s{i}"]["output_token_ids"]) == 6 for i in range(3))
    assert worker.engine.block_manager.num_used_blocks == 0 and not worker.engine.requests


# ---- what can never fit, and stopping whatever the worker holds ---------------------------------------


def test_choices_that_can_never_fit_the_cache_fail_at_once_and_the_batch_goes_on(tmp_path, redis_url, tiny_model):
    lines = [
        {"id": "wide", "prompt": "hello", "max_tokens": 100, "n": 128},
        {"id": "plain", "prompt": "hello", "max_tokens": 5, "ignore_eos": True},
    ]
    batch_id = submit(tmp_path, redis_url, tiny_model, lines)
    conn = redis.Redis.from_url(redis_url)
    run_worker(conn, tiny_model, "2MiB")
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.failed) == ("completed", 1, 1)
    rows = {r["custom_id"]: r for r in read_parts(str(tmp_path / "out"), batch_id).to_pylist()}
    assert "each of its 128 choices" in rows["wide"]["error"] and "more than the whole cache" in rows["wide"]["error"]
    assert rows["plain"]["error"] is None and len(rows["plain"]["output_token_ids"]) == 5


def test_sigterm_stops_a_worker_within_its_grace_whatever_it_holds(tmp_path, redis_url, long_context_model):
    """The worker holds requests of 128 choices each and thousands of tokens to go; after SIGTERM it stops
    taking jobs, waits out its 1 s grace, puts every held request back on the queue and exits cleanly."""
    lines = [
        {"id": f"w{i}", "prompt": f"hello {i}", "max_tokens": 4000, "n": 128, "ignore_eos": True} for i in range(3)
    ]
    batch_id = submit(tmp_path, redis_url, long_context_model, lines)
    conn = redis.Redis.from_url(redis_url)
    command, env = worker_command(redis_url, long_context_model, "--kv-cache-memory", "256MiB", "--shutdown-grace", "1")
    worker = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    queue = Queue(queue_for(long_context_model), connection=conn, serializer=JSONSerializer)
    assert wait_for(lambda: queue.count == 0 and len(queue.started_job_registry) == 3, timeout_s=120)
    time.sleep(1)  # let it get well into the requests
    signalled = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0, worker.stderr.read()
    stopped_after_s = time.monotonic() - signalled
    assert stopped_after_s < 30, f"the worker took {stopped_after_s:.0f} s to stop with a 1 s grace"
    assert sorted(queue.job_ids) == sorted(batches.job_id(batch_id, f"w{i}") for i in range(3))
    assert batches.get_batch(conn, batch_id).completed == 0


def test_rq_started_workers_take_the_weight_format_from_the_environment(redis_url, tiny_model, monkeypatch):
    """`rq worker -w miro.worker.BatchWorker` passes no options: MIRO_WEIGHTS stands for --weights."""
    monkeypatch.setenv("MIRO_WEIGHTS", "native")
    monkeypatch.setenv("MIRO_KV_CACHE_MEMORY", "4MiB")
    conn = redis.Redis.from_url(redis_url)
    worker = BatchWorker(
        [Queue(queue_for(tiny_model), connection=conn, serializer=JSONSerializer)],
        connection=conn,
        serializer=JSONSerializer,
        model=tiny_model,
    )
    worker.work(burst=True, logging_level="WARNING")
    assert worker.engine.weight_format == "native"
