"""miro-submit -> an RQ worker (RQ's own SimpleWorker running miro.worker.jobs.generate, or miro's
BatchWorker) -> miro results, on a real redis-server and a tiny GGUF model."""

import json
import signal
import time

import pyarrow.parquet as pq
import pytest
import redis
from click.testing import CliRunner
from fleet_processes import worker_command
from polling import wait_for
from rq import Queue, SimpleWorker
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer

from miro.cli.main import cli
from miro.core import Engine, SamplingParams
from miro.worker import BatchWorker
from miro.worker.fleet.records import batches, keys
from miro.worker.fleet.lifecycle import release
from miro.worker.fleet.records.payload import payloads_of
from miro.worker.fleet.records.workers import list_workers
from miro.worker.fleet.intake.routing import queue_for
from miro.worker.process import taking


def write_dataset(path, lines):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def make_worker(kind, queue, conn, tiny_model):
    if kind == "simple":
        return SimpleWorker([queue], connection=conn, serializer=JSONSerializer)
    return BatchWorker(
        [queue],
        connection=conn,
        serializer=JSONSerializer,
        model=tiny_model,
        engine_options={"kv_cache_memory": "4MiB", "max_num_seqs": 3},
    )


@pytest.mark.parametrize("kind", ["simple", "batch"])
def test_submit_run_with_rq_worker_and_merge_results(
    tmp_path, redis_url, tiny_model, monkeypatch, kind, rq_command_poll
):
    monkeypatch.setenv("MIRO_KV_CACHE_MEMORY", "4MiB")
    lines = [
        {"id": "s1", "prompt": "hello world", "max_tokens": 5, "temperature": 0, "ignore_eos": True},
        {
            "id": "s2",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "temperature": 0,
            "ignore_eos": True,
        },
        {
            "custom_id": "o1",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "x",
                "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 3,
                "temperature": 0,
            },
        },
        {
            "custom_id": "o2",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"prompt": "the world", "max_tokens": 6, "temperature": 0},
        },
        {"id": "long", "prompt": "hello " * 200, "max_tokens": 4},  # over the tiny model's 128-token context
        {"id": "bad", "prompt": 5},  # invalid: recorded as a failed request with --skip-invalid
    ]
    dataset = write_dataset(tmp_path / "data.jsonl", lines)
    out = tmp_path / "results"
    submitted = CliRunner().invoke(
        cli,
        ["submit", dataset, "--redis-url", redis_url, "--model", tiny_model, "--output", str(out), "--skip-invalid"],
    )
    assert submitted.exit_code == 0, submitted.output
    batch_id = submitted.stdout.strip().splitlines()[-1]

    conn = redis.Redis.from_url(redis_url)
    queue = Queue(queue_for(tiny_model), connection=conn, serializer=JSONSerializer)
    assert queue.count == 1  # one group job holds the 5 valid requests
    make_worker(kind, queue, conn, tiny_model).work(burst=True)
    assert queue.count == 0

    record = batches.get_batch(conn, batch_id)
    assert (record.total, record.completed, record.failed) == (6, 4, 2)
    assert record.status == "completed"
    finished_id = batches.group_job_id(batch_id, 0, 0)
    if kind != "batch":  # RQ's worker finishes the job after the count that ended the batch: a later sweep releases it
        assert release.release_stale(conn, now=time.time() + 60) == [batch_id]
    # a finished job's hash and result expire a second after it finished (job_writer.RESULT_TTL)
    assert wait_for(lambda: not conn.exists(Job.key_for(finished_id), f"rq:results:{finished_id}"), timeout_s=5)
    # the request that failed has a failed job of its own, as if it had been queued alone: `miro retry` runs it
    failed = Job.fetch(batches.job_id(batch_id, "long"), connection=conn, serializer=JSONSerializer)
    assert failed.get_status() == JobStatus.FAILED and failed.kwargs["custom_id"] == "long"
    assert failed.id in FailedJobRegistry(queue=queue) and failed.meta == {"batch_id": batch_id, "custom_id": "long"}

    merged_path = tmp_path / "merged.parquet"
    merged = CliRunner().invoke(cli, ["results", batch_id, "-o", str(merged_path), "--redis-url", redis_url])
    assert merged.exit_code == 0, merged.output
    rows = {r["custom_id"]: r for r in pq.read_table(merged_path).to_pylist()}
    assert sorted(rows) == ["bad", "long", "o1", "o2", "s1", "s2"]
    assert "context length" in rows["long"]["error"] and rows["bad"]["error"].startswith("line 6:")
    assert [len(rows[c]["output_token_ids"]) for c in ("s1", "s2")] == [5, 4]

    # greedy outputs equal the engine run directly on the same prompts
    engine = Engine.from_model(tiny_model, num_kv_blocks=64)
    direct = engine.generate(
        [rows["s1"]["prompt"], rows["o2"]["prompt"]],
        [SamplingParams(max_tokens=5, temperature=0, ignore_eos=True), SamplingParams(max_tokens=6, temperature=0)],
        use_tqdm=False,
    )
    assert rows["s1"]["output_token_ids"] == direct[0].token_ids
    assert rows["o2"]["output_token_ids"] == direct[1].token_ids

    jsonl = CliRunner().invoke(
        cli, ["results", batch_id, "-o", str(tmp_path / "out.jsonl"), "--format", "jsonl", "--redis-url", redis_url]
    )
    assert jsonl.exit_code == 0, jsonl.output
    answers = [json.loads(line) for line in open(tmp_path / "out.jsonl")]
    errors = [json.loads(line) for line in open(tmp_path / "out.errors.jsonl")]
    assert sorted(a["custom_id"] for a in answers) == ["o1", "o2", "s1", "s2"]
    assert sorted(e["custom_id"] for e in errors) == ["bad", "long"]


def test_results_of_unknown_batch_is_one_sentence(redis_url, tmp_path):
    result = CliRunner().invoke(
        cli, ["results", "batch_nope", "-o", str(tmp_path / "x.parquet"), "--redis-url", redis_url]
    )
    assert result.exit_code == 1 and "There is no batch 'batch_nope'" in result.output


def test_miro_worker_command_runs_a_batch(tmp_path, redis_url, tiny_model):
    dataset = write_dataset(
        tmp_path / "d.jsonl", [{"id": f"p{i}", "prompt": "hello " * (i + 1), "max_tokens": 3} for i in range(5)]
    )
    submitted = CliRunner().invoke(
        cli, ["submit", dataset, "--redis-url", redis_url, "--model", tiny_model, "--output", str(tmp_path / "out")]
    )
    batch_id = submitted.stdout.strip()
    ran = CliRunner().invoke(
        cli, ["worker", "--redis-url", redis_url, "--model", tiny_model, "--burst", "--kv-cache-memory", "4MiB"]
    )
    assert ran.exit_code == 0, ran.output
    record = batches.get_batch(redis.Redis.from_url(redis_url), batch_id)
    assert (record.completed, record.failed, record.status) == (5, 0, "completed")


@pytest.mark.slow
def test_miro_run_on_the_example_dataset(tmp_path, smollm2_path):
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "prompts.jsonl"
    out = tmp_path / "results.parquet"
    # f32 pinned for the answer checked below: with native (auto's choice where its kernels are faster) the
    # default model answers q1 as llama.cpp does on this file, "L'Étoile, la Cité, ..."
    result = CliRunner().invoke(
        cli,
        [
            "run",
            str(example),
            "-o",
            str(out),
            "--model",
            str(smollm2_path),
            "--kv-cache-memory",
            "256MiB",
            "--weights",
            "f32",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = pq.read_table(out).to_pylist()
    n_lines = sum(1 for line in example.read_text().splitlines() if line.strip())
    assert len(rows) == n_lines and len({r["custom_id"] for r in rows}) == n_lines
    assert all(r["error"] is None and r["output"] for r in rows)
    assert "Paris" in next(r["output"] for r in rows if r["custom_id"] == "q1")


LONG_BATCH = 60  # requests of 100 tokens each: long enough to stop a worker in the middle


def submit_long_batch(tmp_path, redis_url, tiny_model) -> str:
    dataset = write_dataset(
        tmp_path / "d.jsonl",
        [{"id": f"p{i}", "prompt": f"hello {i}", "max_tokens": 100, "ignore_eos": True} for i in range(LONG_BATCH)],
    )
    submitted = CliRunner().invoke(
        cli, ["submit", dataset, "--redis-url", redis_url, "--model", tiny_model, "--output", str(tmp_path / "out")]
    )
    return submitted.stdout.strip()


def assert_every_row_once(tmp_path, redis_url, batch_id) -> None:
    conn = redis.Redis.from_url(redis_url)
    record = batches.get_batch(conn, batch_id)
    assert (record.completed, record.failed, record.status) == (LONG_BATCH, 0, "completed")
    merged = CliRunner().invoke(cli, ["results", batch_id, "-o", str(tmp_path / "m.parquet"), "--redis-url", redis_url])
    assert merged.exit_code == 0
    rows = pq.read_table(tmp_path / "m.parquet").to_pylist()
    assert sorted(r["custom_id"] for r in rows) == sorted(f"p{i}" for i in range(LONG_BATCH))
    assert all(r["error"] is None and len(r["output_token_ids"]) == 100 for r in rows)


@pytest.mark.slow
def test_sigterm_mid_batch_requeues_and_nothing_is_lost(tmp_path, redis_url, tiny_model):
    import signal
    import subprocess

    batch_id = submit_long_batch(tmp_path, redis_url, tiny_model)
    conn = redis.Redis.from_url(redis_url)
    command, env = worker_command(redis_url, tiny_model)
    first = subprocess.Popen(command + ["--shutdown-grace", "0"], env=env, stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: batches.get_batch(conn, batch_id).completed >= 3), "the first worker did no work"
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=60) == 0, first.stderr.read()
    after_stop = batches.get_batch(conn, batch_id)
    assert after_stop.completed < LONG_BATCH, "the batch finished before the signal: nothing was in flight"
    queued = Job.fetch_many(
        Queue(queue_for(tiny_model), connection=conn, serializer=JSONSerializer).job_ids,
        connection=conn,
        serializer=JSONSerializer,
    )
    waiting = [p.custom_id for job in queued for p in payloads_of(job.kwargs)]
    counted = conn.smismember(keys.batch_counted(batch_id), waiting)
    # what it held is back on the queue: the queued jobs hold every request not yet counted
    assert sum(1 for c in counted if not c) == LONG_BATCH - after_stop.completed

    second = subprocess.run(command + ["--burst"], env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert_every_row_once(tmp_path, redis_url, batch_id)


@pytest.mark.slow
def test_kill_9_mid_batch_jobs_run_again_on_a_live_worker(tmp_path, redis_url, tiny_model):
    import signal
    import subprocess

    batch_id = submit_long_batch(tmp_path, redis_url, tiny_model)
    conn = redis.Redis.from_url(redis_url)
    command, env = worker_command(
        redis_url, tiny_model, "--job-monitoring-interval", "1", "--heartbeat-slack", "2", "--maintenance-interval", "1"
    )
    doomed = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
    assert wait_for(lambda: batches.get_batch(conn, batch_id).completed >= 3), "the worker did no work"
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    assert batches.get_batch(conn, batch_id).completed < LONG_BATCH

    survivor = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: batches.get_batch(conn, batch_id).status == "completed", timeout_s=120)
    finally:
        survivor.send_signal(signal.SIGTERM)
        survivor.wait(timeout=60)
    assert_every_row_once(tmp_path, redis_url, batch_id)


def test_a_job_taken_by_a_worker_killed_before_starting_it_runs_again(tmp_path, redis_url, tiny_model):
    """The window kill -9 hits most (a worker takes its next jobs just as the last ones are counted): the job
    is off the queue, not yet started. It waits on its queue's intermediate list, and maintenance queues it
    again once RQ's minute there has passed (aged here by hand)."""
    from rq.intermediate_queue import IntermediateQueue

    batch_id = submit_long_batch(tmp_path, redis_url, tiny_model)
    conn = redis.Redis.from_url(redis_url)
    queue = Queue(queue_for(tiny_model), connection=conn, serializer=JSONSerializer)
    first_id = queue.job_ids[0]

    def live_worker() -> BatchWorker:
        return BatchWorker(
            [queue],
            connection=conn,
            serializer=JSONSerializer,
            model=tiny_model,
            engine_options={"kv_cache_memory": "8MiB", "max_num_seqs": 4},
        )

    doomed = live_worker()
    job, taken_from = taking.take_next(doomed, doomed.queues)  # its high, normal and low queues; then kill -9
    assert (job.id, taken_from.name) == (first_id, queue.name)
    assert first_id not in queue.job_ids and queue.intermediate_queue.get_job_ids() == [first_id]

    maintainer = live_worker()
    maintainer.run_maintenance_tasks()  # RQ notes when it first saw the job there...
    intermediate = IntermediateQueue(queue.key, connection=conn)
    conn.set(intermediate.get_first_seen_key(first_id), time.time() - 120)
    maintainer.run_maintenance_tasks()  # ...and a minute later queues it again, one retry fewer
    assert first_id in queue.job_ids and intermediate.get_job_ids() == []
    live_worker().work(burst=True, logging_level="WARNING")
    assert_every_row_once(tmp_path, redis_url, batch_id)


def test_a_request_that_ran_twice_counts_once(redis_url):
    conn = redis.Redis.from_url(redis_url)
    batch_id = batches.create_batch(conn, name="n", model="m", input_file="f", output="o", total=2, queue="miro")
    batches.set_status(conn, batch_id, "in_progress")
    batches.count_finished(conn, batch_id, "a", prompt_tokens=5, completion_tokens=3)
    batches.count_finished(conn, batch_id, "a", prompt_tokens=5, completion_tokens=3)  # its worker died, rerun
    record = batches.get_batch(conn, batch_id)
    assert (record.completed, record.prompt_tokens, record.status) == (1, 5, "in_progress")
    batches.count_failed(conn, batch_id, "b")
    record = batches.get_batch(conn, batch_id)
    assert (record.completed, record.failed, record.status) == (1, 1, "completed")


@pytest.mark.slow
def test_two_workers_200_mixed_lines_exactly_once_and_equal_to_the_engine(tmp_path, redis_url, tiny_model):
    import os
    import subprocess
    import sys

    lines = []
    for i in range(200):
        if i % 3 == 0:
            lines.append({"id": f"s{i}", "prompt": f"hello world {i}", "max_tokens": 8, "temperature": 0})
        elif i % 3 == 1:
            lines.append(
                {
                    "custom_id": f"c{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {"messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 6, "temperature": 0},
                }
            )
        else:
            lines.append(
                {
                    "custom_id": f"t{i}",
                    "method": "POST",
                    "url": "/v1/completions",
                    "body": {"prompt": f"the world {i}", "max_tokens": 5, "temperature": 0},
                }
            )
    dataset = write_dataset(tmp_path / "d.jsonl", lines)
    miro = [sys.executable, "-c", "from miro.cli.main import cli; cli()"]
    options = [
        "worker",
        "--redis-url",
        redis_url,
        "--model",
        tiny_model,
        "--kv-cache-memory",
        "8MiB",
        "--max-num-seqs",
        "8",
    ]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    conn = redis.Redis.from_url(redis_url)
    workers = [subprocess.Popen(miro + options, env=env, stderr=subprocess.DEVNULL) for _ in range(2)]
    try:
        # both waiting before the batch comes, so neither can take it all while the other still starts (a busy
        # machine once started one 7 s late)
        assert wait_for(lambda: len(list_workers(conn)) == 2, timeout_s=120), "the workers did not start"
        submitted = CliRunner().invoke(
            cli, ["submit", dataset, "--redis-url", redis_url, "--model", tiny_model, "--output", str(tmp_path / "out")]
        )
        batch_id = submitted.stdout.strip()
        assert wait_for(lambda: batches.get_batch(conn, batch_id).status == "completed", timeout_s=300)
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)  # a warm stop: it finishes what it holds, then exits 0
    assert [w.wait(timeout=60) for w in workers] == [0, 0]
    record = batches.get_batch(conn, batch_id)
    assert (record.completed, record.failed, record.status) == (200, 0, "completed")
    parts = list((tmp_path / "out" / batch_id).glob("part-*.parquet"))
    assert len({pq.read_table(p)["worker"][0].as_py() for p in parts}) == 2, "both workers should have worked"

    merged = CliRunner().invoke(cli, ["results", batch_id, "-o", str(tmp_path / "m.parquet"), "--redis-url", redis_url])
    assert merged.exit_code == 0
    rows = pq.read_table(tmp_path / "m.parquet").to_pylist()
    assert len(rows) == 200 and len({r["custom_id"] for r in rows}) == 200
    engine = Engine.from_model(tiny_model, num_kv_blocks=256)
    params = [SamplingParams(**json.loads(r["sampling"])) for r in rows]
    direct = engine.generate([r["prompt"] for r in rows], params, use_tqdm=False)
    assert [r["output_token_ids"] for r in rows] == [d.token_ids for d in direct]


@pytest.mark.parametrize(
    "command",
    [
        ["submit", "DATASET"],
        ["worker", "--burst", "--wait-for-redis", "0"],
        ["results", "batch_x", "-o", "OUT"],
        ["run", "DATASET"],
        ["cancel", "batch_x"],
        ["retry", "batch_x"],
        ["status"],
        ["watch", "batch_x"],
    ],
)
def test_redis_unreachable_is_one_sentence_for_every_command(tmp_path, command):
    dataset = write_dataset(tmp_path / "d.jsonl", [{"id": "a", "prompt": "hi"}])
    args = [dataset if a == "DATASET" else str(tmp_path / "o.parquet") if a == "OUT" else a for a in command]
    result = CliRunner().invoke(cli, args + ["--redis-url", "redis://127.0.0.1:1/0"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: Cannot reach Redis at redis://127.0.0.1:1/0")
    assert "Traceback" not in result.output and result.output.count("\n") == 1


def test_rq_info_lists_the_batch_worker(redis_url, tiny_model):
    import os
    import subprocess
    import sys
    import threading

    conn = redis.Redis.from_url(redis_url)
    queue = Queue(queue_for(tiny_model), connection=conn, serializer=JSONSerializer)
    worker = make_worker("batch", queue, conn, tiny_model)
    thread = threading.Thread(target=worker.work, kwargs={"burst": False}, daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: any(worker.name in m.decode() for m in conn.smembers("rq:workers")), 30)
        rq_cli = os.path.join(os.path.dirname(sys.executable), "rq")
        info = subprocess.run([rq_cli, "info", "--url", redis_url], capture_output=True, text=True, timeout=60)
        assert worker.name in info.stdout and "miro" in info.stdout
    finally:
        worker.request_warm_stop(0)
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_a_job_outside_the_allow_list_fails_without_running(redis_url, tiny_model, tmp_path):
    conn = redis.Redis.from_url(redis_url)
    queue = Queue(queue_for(tiny_model), connection=conn, serializer=JSONSerializer)
    marker = tmp_path / "ran"
    job = queue.enqueue("pathlib.Path.touch", str(marker))
    make_worker("batch", queue, conn, tiny_model).work(burst=True)
    job = Job.fetch(job.id, connection=conn, serializer=JSONSerializer)
    assert job.get_status() == JobStatus.FAILED and not marker.exists()
    assert "not on this worker's allow-list" in job.latest_result().exc_string


@pytest.mark.parametrize("value, expected", [(None, None), ("0", False), ("false", False), ("1", True), ("yes", True)])
def test_rq_worker_engine_settings_from_the_environment(monkeypatch, value, expected):
    """`rq worker -w miro.worker.BatchWorker` takes engine settings from MIRO_* variables, as the CLI's options."""
    from miro.worker.process.batch_worker import engine_options_from_env

    for name in ("MIRO_BATCH_INVARIANT", "MIRO_WEIGHTS", "MIRO_MAX_NUM_SEQS"):
        monkeypatch.delenv(name, raising=False)
    if value is not None:
        monkeypatch.setenv("MIRO_BATCH_INVARIANT", value)
    monkeypatch.setenv("MIRO_WEIGHTS", "f32")
    monkeypatch.setenv("MIRO_MAX_NUM_SEQS", "8")
    options = engine_options_from_env()
    assert options.get("batch_invariant") == expected
    assert options["weights"] == "f32" and options["max_num_seqs"] == 8


def test_the_job_function_name_every_job_carries_finds_the_process_module():
    """Jobs name their function `miro.worker.jobs.generate` (submit.JOB_FUNCTION, the BatchWorker's allow-list,
    jobs queued before the function moved to miro.worker.process.jobs): RQ still imports it by that name."""
    from rq.utils import import_attribute

    from miro.worker.fleet.intake.job_writer import JOB_FUNCTION
    from miro.worker.process import jobs
    from miro.worker.process.batch_worker import ALLOWED_FUNCTIONS

    assert JOB_FUNCTION == "miro.worker.jobs.generate" and ALLOWED_FUNCTIONS == {JOB_FUNCTION}
    assert import_attribute(JOB_FUNCTION) is jobs.generate
