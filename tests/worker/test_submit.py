"""miro-submit against a real redis-server: jobs, batch records, --dry-run, --resume (bad inputs and --skip-invalid:
test_submit_invalid.py)."""

import json
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from gguf_factory import write_tiny_llama
import redis
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer
from rq.utils import utcparse
from submit_helpers import BATCH_ID, CHAT, COMPLETIONS, GOOD, conn_for, job_of, openai, queue, run, write

from miro.core import defaults
from miro.core.errors import MiroError
from miro.worker.fleet.records import batches, keys
from miro.worker.fleet.intake import feed
from miro.worker.fleet.intake.dataset import parse_dataset
from miro.worker.fleet.intake.job_writer import FAILURE_TTL, JOB_FUNCTION, RESULT_TTL, JobWriter
from miro.worker.fleet.intake.submit import submit

pytestmark = pytest.mark.usefixtures("one_request_per_job")  # they follow one request's RQ job

BIN = Path(sys.executable).parent


MIXED = [
    {"id": "q1", "prompt": "Say hi.", "max_tokens": 5},
    {
        "id": "q2",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "temperature": 0.5,
        "stop": "\n",
    },
    openai("c1", CHAT, model="gpt-4o-mini", max_completion_tokens=7),
    openai("c2", COMPLETIONS, prompt="Once upon a time", seed=3),
    {"prompt": "no id on this line"},
]


# ---- a valid dataset --------------------------------------------------------------------------------


def test_mixed_dataset_enqueues_one_job_per_line(tmp_path, redis_url, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = write(tmp_path / "mixed.jsonl", *MIXED)
    result = run(
        "submit",
        data,
        "--redis-url",
        redis_url,
        "--max-tokens",
        "32",
        "--temperature",
        "0",
        "--name",
        "mixed run",
        "--job-timeout",
        "2h",
        "--model",
        "smollm2-135m",
    )
    assert result.exit_code == 0, result.output
    batch_id = result.stdout.strip()
    assert result.stdout == batch_id + "\n" and BATCH_ID.fullmatch(batch_id)
    assert "Enqueued 5 requests" in result.stderr

    conn = conn_for(redis_url)
    q = queue(conn)
    assert q.count == 5
    ids = ["q1", "q2", "c1", "c2", "line-5"]
    assert q.job_ids == [batches.job_id(batch_id, cid) for cid in ids]  # file order
    assert len(set(q.job_ids)) == 5

    # the JobPayload as kwargs: fields that are not set (None) are left out
    expected_kwargs = {
        "q1": {"kind": "completion", "prompt": "Say hi.", "sampling": {"max_tokens": 5, "temperature": 0.0}, "line": 1},
        "q2": {
            "kind": "chat",
            "messages": MIXED[1]["messages"],
            "sampling": {"max_tokens": 32, "temperature": 0.5, "stop": ["\n"]},
            "line": 2,
        },
        "c1": {
            "kind": "chat",
            "messages": [{"role": "user", "content": "hi"}],
            "sampling": {"max_tokens": 7, "temperature": 0.0},
            "requested_model": "gpt-4o-mini",
            "line": 3,
        },
        "c2": {
            "kind": "completion",
            "prompt": "Once upon a time",
            "sampling": {"max_tokens": 32, "temperature": 0.0, "seed": 3},
            "line": 4,
        },
        "line-5": {
            "kind": "completion",
            "prompt": "no id on this line",
            "sampling": {"max_tokens": 32, "temperature": 0.0},
            "line": 5,
        },
    }
    for cid in ids:
        job = job_of(conn, batch_id, cid)
        assert job.func_name == JOB_FUNCTION
        assert job.args == []
        assert job.kwargs == {
            "batch_id": batch_id,
            "custom_id": cid,
            "model": "smollm2-135m",
            "priority": "normal",
            **expected_kwargs[cid],
        }
        assert job.meta == {"batch_id": batch_id, "custom_id": cid}
        assert job.get_status() == JobStatus.QUEUED
        assert job.origin == "miro:smollm2-135m" and job.enqueued_at is not None
        assert job.timeout == 7200 and job.result_ttl == RESULT_TTL == 1 and job.failure_ttl == FAILURE_TTL
        assert conn.ttl(job.key) == -1  # a queued job never expires
        # stored as JSON, never pickle
        func, instance, args, kwargs = json.loads(zlib.decompress(conn.hget(job.key, "data")))
        assert func == JOB_FUNCTION and kwargs["custom_id"] == cid
    assert conn.hlen(keys.batch_jobs(batch_id)) == 0  # fed jobs are listed by the stored chunks, not in Redis

    record = batches.get_batch(conn, batch_id)
    assert record.id == batch_id and record.name == "mixed run"
    assert record.status == "in_progress"
    assert record.model == "smollm2-135m" and record.queue == "miro:smollm2-135m"
    assert record.total == 5
    assert record.completed == record.failed == record.prompt_tokens == record.completion_tokens == 0
    assert record.output == str(tmp_path / "miro-results")
    assert record.input_file == str(data)
    assert record.job_timeout == 7200
    assert isinstance(record.created_at, float)
    assert record.created_at == record.at("validating") <= record.at("in_progress")
    assert conn.zscore(keys.batches(), batch_id) == record.created_at
    assert conn.hlen(keys.batch_invalid(batch_id)) == 0


def redis_encoded(value) -> bytes:
    """A value as redis-py sends it (a str enum by its value)."""
    return value if isinstance(value, bytes) else value.encode() if isinstance(value, str) else repr(value).encode()


def test_stored_job_hashes_equal_rqs_own(tmp_path, redis_url, monkeypatch):
    """The feeder writes each chunk's group jobs with one script, and --resume its one-request jobs with another:
    each hash must be exactly what RQ's Job.to_dict() gives for the same job."""
    monkeypatch.setattr(defaults, "REQUESTS_PER_JOB", 3)
    data = write(tmp_path / "mixed.jsonl", *MIXED, {"id": "\u00e9t\u00e9 \U0001f600 " + "x" * 300, "prompt": "long id"})
    conn = conn_for(redis_url)
    result = submit(conn, data, chunk_size=4, job_timeout="30m", model="smollm2-135m")
    enqueuer = JobWriter(conn, "miro:smollm2-135m", result.batch_id, "smollm2-135m", "normal", 1800)
    parsed = parse_dataset(data)
    assert len(parsed.requests) == 6
    for chunk, part, requests in [
        (0, 0, parsed.requests[:3]),
        (0, 1, parsed.requests[3:4]),
        (1, 0, parsed.requests[4:]),
    ]:
        stored = conn.hgetall(Job.key_for(batches.group_job_id(result.batch_id, chunk, part)))
        expected = enqueuer.group_job(chunk, part, requests, utcparse(stored[b"enqueued_at"].decode())).to_dict()
        assert stored == {k.encode(): redis_encoded(v) for k, v in expected.items()}
    with conn.pipeline() as pipe:
        enqueuer.write(pipe, parsed.requests)
        pipe.execute()
    for request in parsed.requests:
        stored = conn.hgetall(Job.key_for(batches.job_id(result.batch_id, request.custom_id)))
        expected = enqueuer.job(enqueuer.payload_of(request), utcparse(stored[b"enqueued_at"].decode())).to_dict()
        assert stored == {k.encode(): redis_encoded(v) for k, v in expected.items()}


def test_options_queue_model_output_and_batch_list(tmp_path, redis_url):
    data = write(tmp_path / "d.jsonl", *MIXED[:2])
    other_model = write_tiny_llama(tmp_path / "other-model.gguf")["path"]  # a .gguf file here is a known model
    output = f"file://{tmp_path}/out"  # a URI is kept as given (the requests are stored there)
    first = run(
        "submit", data, "--redis-url", redis_url, "--queue", "gpu", "--model", str(other_model), "--output", output
    )
    second = run("submit", data, "--redis-url", redis_url)
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    conn = conn_for(redis_url)
    assert queue(conn, "gpu").count == 2 and queue(conn).count == 2
    listed = batches.list_batches(conn)
    assert [b.id for b in listed] == [second.stdout.strip(), first.stdout.strip()]  # newest first
    assert listed[1].output == output and listed[1].model == str(other_model)
    assert listed[1].name == "d.jsonl" and listed[1].queue == "gpu"
    job = Job.fetch(queue(conn, "gpu").job_ids[0], connection=conn, serializer=JSONSerializer)
    assert job.kwargs["model"] == str(other_model) and job.origin == "gpu"


def test_many_lines_are_stored_and_fed_a_window_at_a_time_in_order(tmp_path, redis_url):
    """Submit stores every request and queues the first window (FEED_MARGIN with no worker); each top-up once the
    queue drains queues the next chunk, so the job ids come in file order across windows."""
    data = write(tmp_path / "d.jsonl", *({"id": f"r{i}", "prompt": f"p {i}"} for i in range(2500)))
    conn = conn_for(redis_url)
    result = submit(conn, data, chunk_size=1000, output=str(tmp_path / "out"))
    assert result.enqueued == 1000 and result.stored == 2500 and result.jobs_per_s > 0
    record = batches.get_batch(conn, result.batch_id)
    assert (record.total, record.chunks, record.spooled, record.fed, record.fed_requests) == (2500, 3, 2500, 1, 1000)
    assert sorted(p.name for p in (tmp_path / "out" / result.batch_id / "_requests").iterdir()) == [
        "0000000.jsonl",
        "0000001.jsonl",
        "0000002.jsonl",
    ]
    q = queue(conn)
    assert feed.top_up(conn) == 0  # the window is full
    seen = []
    while q.count:
        seen += [jid.decode() for jid in conn.lpop(q.key, 1000)]  # the fleet drains the queue
        feed.top_up(conn)
    assert seen == [batches.job_id(result.batch_id, f"r{i}") for i in range(2500)]
    assert conn.hlen(keys.batch_jobs(result.batch_id)) == 0  # no per-request index: the chunks list them
    assert conn.zscore(keys.feeding(), result.batch_id) is None  # nothing left to feed
    assert batches.get_batch(conn, result.batch_id).fed_requests == 2500


# ---- --dry-run ---------------------------------------------------------------------------------------


def test_dry_run_touches_nothing(tmp_path, redis_url):
    data = write(tmp_path / "d.jsonl", *MIXED)
    result = run("submit", data, "--redis-url", redis_url, "--dry-run", "--model", "smollm2-135m")
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert "Dry run: 5 valid lines, 0 invalid; nothing was enqueued." in result.stderr
    assert conn_for(redis_url).dbsize() == 0
    # it does not even need Redis, and it still reports invalid lines
    bad = write(tmp_path / "bad.jsonl", GOOD, "{broken")
    offline = run("submit", bad, "--redis-url", "redis://127.0.0.1:1/0", "--dry-run")
    assert offline.exit_code == 1 and "line 2: not valid JSON" in offline.stderr
    skipped = run("submit", bad, "--redis-url", "redis://127.0.0.1:1/0", "--dry-run", "--skip-invalid")
    assert skipped.exit_code == 0 and "Dry run: 1 valid lines, 1 invalid" in skipped.stderr


# ---- --resume ---------------------------------------------------------------------------------------


def _take_off_queue(conn, job: Job, status: JobStatus) -> None:
    queue(conn, job.origin).remove(job)
    job.set_status(status)


def test_resume_enqueues_only_requests_without_a_finished_or_running_job(tmp_path, redis_url):
    lines = [{"id": f"r{i}", "prompt": f"prompt {i}"} for i in range(6)]
    data = write(tmp_path / "d.jsonl", *lines)
    conn = conn_for(redis_url)
    batch_id = submit(conn, data).batch_id
    jid = {f"r{i}": batches.job_id(batch_id, f"r{i}") for i in range(7)}

    _take_off_queue(conn, job_of(conn, batch_id, "r0"), JobStatus.FINISHED)
    failed_job = job_of(conn, batch_id, "r1")
    _take_off_queue(conn, failed_job, JobStatus.FAILED)
    FailedJobRegistry("miro:smollm2-135m", connection=conn, serializer=JSONSerializer).add(failed_job, ttl=100)
    batches.count_failed(conn, batch_id, "r1")  # as a worker counts a failed job
    _take_off_queue(conn, job_of(conn, batch_id, "r2"), JobStatus.STARTED)
    job_of(conn, batch_id, "r3").delete()  # gone from Redis (expired)
    write(tmp_path / "d.jsonl", *lines, {"id": "r6", "prompt": "a new line"})

    result = run("submit", data, "--redis-url", redis_url, "--resume", batch_id)
    assert result.exit_code == 0, result.output
    assert result.stdout == batch_id + "\n"
    assert "enqueued 3 requests; 1 already finished, 3 still queued or running, 1 had expired" in result.stderr
    q = queue(conn)
    assert q.job_ids == [jid["r4"], jid["r5"], jid["r1"], jid["r3"], jid["r6"]]
    assert job_of(conn, batch_id, "r0").get_status() == JobStatus.FINISHED
    assert job_of(conn, batch_id, "r2").get_status() == JobStatus.STARTED
    for cid in ("r1", "r3", "r6"):
        job = job_of(conn, batch_id, cid)
        assert job.get_status() == JobStatus.QUEUED and job.kwargs["custom_id"] == cid and job.exc_info is None
    assert jid["r1"] not in FailedJobRegistry("miro:smollm2-135m", connection=conn, serializer=JSONSerializer)
    record = batches.get_batch(conn, batch_id)
    assert record.total == 7 and record.failed == 0 and record.status == "in_progress"
    assert conn.hget(keys.batch_jobs(batch_id), "r6").decode() == jid["r6"]

    again = run("submit", data, "--redis-url", redis_url, "--resume", batch_id)
    assert again.exit_code == 0 and "enqueued 0 requests" in again.stderr
    assert q.count == 5 and batches.get_batch(conn, batch_id).total == 7


def test_resume_reopens_a_completed_batch_and_counts_a_fixed_line_once(tmp_path, redis_url):
    data = write(tmp_path / "d.jsonl", {"id": "a", "prompt": "x"}, {"id": "b", "prompt": 5})
    conn = conn_for(redis_url)
    first = submit(conn, data, skip_invalid=True)
    batch_id = first.batch_id
    assert first.recorded_invalid == 1
    assert batches.get_batch(conn, batch_id).total == 2 and batches.get_batch(conn, batch_id).failed == 1
    _take_off_queue(conn, job_of(conn, batch_id, "a"), JobStatus.FINISHED)
    conn.hincrby(keys.batch(batch_id), "completed", 1)
    for status in ("finalizing", "completed"):
        batches.set_status(conn, batch_id, status)

    # the same file again: the invalid line is already recorded, the finished job stays
    same = submit(conn, data, skip_invalid=True, resume=batch_id)
    assert same.enqueued == 0 and same.recorded_invalid == 0 and same.already_finished == 1
    record = batches.get_batch(conn, batch_id)
    assert record.status == "completed" and record.total == 2 and record.failed == 1
    # without --skip-invalid the invalid line stops it, nothing changes
    with pytest.raises(MiroError, match="1 of 2 lines is invalid"):
        submit(conn, data, resume=batch_id)

    write(data, {"id": "a", "prompt": "x"}, {"id": "b", "prompt": "fixed"})
    fixed = submit(conn, data, resume=batch_id)
    assert fixed.enqueued == 1 and fixed.already_finished == 1
    assert queue(conn).job_ids == [batches.job_id(batch_id, "b")]
    record = batches.get_batch(conn, batch_id)
    assert record.status == "in_progress" and record.total == 2 and record.failed == 0
    assert record.completed == 1 and batches.failed_lines(conn, batch_id) == {}


def test_resume_errors(tmp_path, redis_url):
    data = write(tmp_path / "d.jsonl", GOOD)
    unknown = run("submit", data, "--redis-url", redis_url, "--resume", "batch_" + "0" * 24)
    assert unknown.exit_code == 1 and unknown.stderr == f"Error: There is no batch 'batch_{'0' * 24}' on this Redis.\n"
    malformed = run("submit", data, "--redis-url", redis_url, "--resume", "q1")
    assert malformed.exit_code == 1 and "'q1' is not a batch id" in malformed.stderr
    conn = conn_for(redis_url)
    assert conn.dbsize() == 0
    batch_id = submit(conn, data, queue_name="gpu").batch_id
    other_queue = run("submit", data, "--redis-url", redis_url, "--resume", batch_id, "--queue", "cpu")
    assert other_queue.exit_code == 1 and "uses queue 'gpu', not 'cpu'" in other_queue.stderr


# ---- batch records ----------------------------------------------------------------------------------


def test_batch_lifecycle(redis_url):
    conn = conn_for(redis_url)
    batch_id = batches.create_batch(
        conn, name="n", model="m", input_file="/x.jsonl", output="/out", total=3, queue="miro"
    )
    assert BATCH_ID.fullmatch(batch_id)
    assert batches.get_batch(conn, batch_id).status == "validating"
    with pytest.raises(MiroError, match="is validating, it cannot become completed"):
        batches.set_status(conn, batch_id, "completed")
    for status in ("in_progress", "cancelling", "cancelled"):
        batches.set_status(conn, batch_id, status)
    record = batches.get_batch(conn, batch_id)
    assert record.status == "cancelled" and record.total == 3
    assert record.created_at <= record.at("in_progress") <= record.at("cancelling") <= record.at("cancelled")
    assert batches.set_status(conn, batch_id, "cancelled") == "cancelled"  # no change, no error
    with pytest.raises(MiroError, match="no batch"):
        batches.set_status(conn, "batch_" + "1" * 24, "in_progress")
    assert batches.record_failed_line(conn, batch_id, custom_id="z", line=9, error="line 9: bad.") == 1
    assert batches.record_failed_line(conn, batch_id, custom_id="z", line=9, error="line 9: bad.") == 0
    record = batches.get_batch(conn, batch_id)
    assert record.total == 4 and record.failed == 1


# ---- Redis unreachable, console script, rq info -----------------------------------------------------


def _dead_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


def test_redis_unreachable_is_one_sentence(tmp_path):
    data = write(tmp_path / "d.jsonl", GOOD)
    url = _dead_url()
    for result in (run("submit", data, "--redis-url", url), run("submit", data, env={"MIRO_REDIS_URL": url})):
        assert result.exit_code == 1
        assert result.stdout == ""
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"Error: Cannot reach Redis at {url}: ")
        assert lines[0].endswith(".")
    password = run("submit", data, "--redis-url", url.replace("//", "//:hunter2@"))
    assert password.exit_code == 1 and "hunter2" not in password.output and ":***@" in password.stderr
    bad_url = run("submit", data, "--redis-url", "http://localhost")
    assert bad_url.exit_code == 1 and bad_url.stderr.startswith("Error: The Redis URL 'http://localhost' is not valid")
    with pytest.raises(MiroError, match=rf"^Cannot reach Redis at {url}: .*\.$"):  # the Python API too
        submit(redis.Redis.from_url(url), data)


def test_console_script_and_rq_info(tmp_path, redis_url):
    data = write(tmp_path / "d.jsonl", *MIXED)
    env = {**os.environ, "MIRO_REDIS_URL": redis_url}
    done = subprocess.run(
        [BIN / "miro-submit", data, "--queue", "infoq", "--model", "smollm2-135m", "--requests-per-job", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert BATCH_ID.fullmatch(done.stdout.strip())
    info = subprocess.run(
        [BIN / "rq", "info", "--url", redis_url, "--raw", "--only-queues"], capture_output=True, text=True, timeout=60
    )
    assert info.returncode == 0, info.stderr
    assert "queue infoq 3, 0 executing, 0 finished, 0 failed" in info.stdout.splitlines()  # 5 requests, 2 a job
    pretty = subprocess.run(
        [BIN / "rq", "info", "--url", redis_url, "infoq"], capture_output=True, text=True, timeout=60
    )
    assert pretty.returncode == 0 and re.search(r"^infoq\s.* 3, 0 executing", pretty.stdout, re.M), pretty.stdout
    unreachable = subprocess.run(
        [BIN / "miro-submit", data, "--redis-url", _dead_url()], capture_output=True, text=True, timeout=120
    )
    assert unreachable.returncode == 1 and unreachable.stderr.startswith("Error: Cannot reach Redis at ")
    assert len(unreachable.stderr.splitlines()) == 1
