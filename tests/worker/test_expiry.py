"""Completion windows on a real redis-server and a BatchWorker on the tiny model: a batch past its window mid-run
keeps what finished, its other requests come back as batch_expired errors, it becomes expired, and nothing of it
runs after; the window is enforced with no server, by the workers; --resume runs the rest in a new window."""

import json
import threading
import time

import pyarrow.parquet as pq
import pytest
import redis
from click.testing import CliRunner
from gguf_factory import write_tiny_llama
from polling import wait_for
from rq import Queue
from rq.serializers import JSONSerializer

from miro.cli.main import cli
from miro.core.errors import MiroError
from miro.worker import BatchWorker
from miro.worker.fleet.records import batches, keys
from miro.worker.fleet.intake import durations
from miro.worker.fleet.lifecycle import expiry
from miro.worker.fleet.output import results
from miro.worker.fleet.intake.routing import queue_for
from miro.worker.fleet.output.rows import EXPIRED_ERROR

pytestmark = pytest.mark.usefixtures("one_request_per_job")  # they follow one request's RQ job


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory) -> str:
    """The tiny model with a 4,096-token context, so that a long request runs for seconds."""
    return str(
        write_tiny_llama(tmp_path_factory.mktemp("m") / "tiny-long.gguf", tensor_type="Q8_0", context_length=4096)[
            "path"
        ]
    )


def submit(tmp_path, redis_url, model, lines, window: str, *extra: str) -> str:
    dataset = tmp_path / "d.jsonl"
    dataset.write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = CliRunner().invoke(
        cli,
        [
            "submit",
            str(dataset),
            "--redis-url",
            redis_url,
            "--model",
            model,
            "--output",
            str(tmp_path / "out"),
            "--completion-window",
            window,
            *extra,
        ],
    )
    assert done.exit_code == 0, done.output
    return done.stdout.strip().splitlines()[-1]


def request(custom_id: str, max_tokens: int) -> dict:
    return {
        "id": custom_id,
        "prompt": f"hello {custom_id}",
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


def part_rows(tmp_path, batch_id) -> list[dict]:
    return pq.read_table(tmp_path / "out" / batch_id).to_pylist()


def test_windows_are_durations():
    assert [durations.completion_window(w) for w in ("24h", "30m", "90s", "2d", "45")] == [86400, 1800, 90, 172800, 45]
    for bad in ("0h", "soon", "-1h", "1w", ""):
        with pytest.raises(MiroError, match="is not valid: give a duration such as 24h"):
            durations.completion_window(bad)


def test_a_batch_past_its_window_mid_run_keeps_what_finished_and_expires_the_rest(
    tmp_path, redis_url, long_context_model
):
    conn = redis.Redis.from_url(redis_url)
    model = long_context_model
    worker = BatchWorker(
        [queue_for(model)],
        connection=conn,
        serializer=JSONSerializer,
        model=model,
        engine_options={"kv_cache_memory": "64MiB", "max_num_seqs": 2},
        flush_rows=1,
    )
    running = threading.Thread(target=worker.work)
    running.start()
    try:
        assert wait_for(lambda: worker.engine is not None, timeout_s=120, every_s=0.01)  # the model is loaded
        lines = [request("s0", 2), request("s1", 2)] + [request(f"l{i}", 4000) for i in range(12)]
        batch_id = submit(tmp_path, redis_url, model, lines, "3s")
        record = batches.get_batch(conn, batch_id)
        assert (record.completion_window, record.expires_at) == ("3s", pytest.approx(record.created_at + 3, abs=0.01))
        ended = wait_for(
            lambda: (b := batches.get_batch(conn, batch_id)).status == "expired" and b, timeout_s=60, every_s=0.05
        )
        assert ended, batches.get_batch(conn, batch_id)
        assert not worker.in_flight  # the long requests it held were aborted
        time.sleep(1.5)  # a worker that would still run something of it has had time to
    finally:
        worker.request_warm_stop(0)
        running.join(timeout=60)
    record = batches.get_batch(conn, batch_id)
    assert record.status == "expired" and record.at("expired") >= record.expires_at
    assert record.completed >= 2 and record.expired >= 4 and record.completed + record.expired == 14
    assert record.failed == 0 and record.to_dict()["expired"] == record.expired
    assert Queue(queue_for(model), connection=conn, serializer=JSONSerializer).count == 0
    assert conn.zscore(keys.batch_deadlines(), batch_id) is None  # nothing left to expire

    rows = part_rows(tmp_path, batch_id)  # what ran: each row started before the window ended
    assert {r["custom_id"] for r in rows} >= {"s0", "s1"} and len(rows) == record.completed
    assert all(r["error"] is None and r["started_at"].timestamp() <= record.expires_at + 0.001 for r in rows)

    table, _ = results.collect(conn, batch_id)
    assert table.num_rows == 14
    lines = list(results.openai_lines(table))
    finished = [line for line in lines if line["error"] is None]
    expired = [line for line in lines if line["error"] is not None]
    assert len(finished) == record.completed and len(expired) == record.expired
    assert {line["custom_id"] for line in finished} | {line["custom_id"] for line in expired} == {
        line["id"] for line in [request("s0", 2), request("s1", 2)] + [request(f"l{i}", 1) for i in range(12)]
    }
    assert all(line["error"] == {"code": "batch_expired", "message": EXPIRED_ERROR} for line in expired)
    assert all(line["id"].startswith(f"batch_req_{batch_id}-") for line in expired)


def test_workers_enforce_the_window_before_they_start_a_job_and_resume_gives_a_new_one(tmp_path, redis_url, tiny_model):
    conn = redis.Redis.from_url(redis_url)
    batch_id = submit(tmp_path, redis_url, tiny_model, [request(f"r{i}", 2) for i in range(6)], "2s")
    worker = dict(
        connection=conn,
        serializer=JSONSerializer,
        model=tiny_model,
        flush_rows=1,
        engine_options={"kv_cache_memory": "4MiB", "max_num_seqs": 1},
    )
    BatchWorker([queue_for(tiny_model)], **worker).work(burst=True, max_jobs=2)  # two run, four stay queued
    assert batches.get_batch(conn, batch_id).completed == 2
    assert wait_for(lambda: time.time() > batches.get_batch(conn, batch_id).expires_at, timeout_s=5, every_s=0.05)

    late = BatchWorker([queue_for(tiny_model)], **worker)  # no server runs: the next worker expires the batch
    late.work(burst=True)
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.expired) == ("expired", 2, 4)
    assert late.jobs_done == 0 and len(part_rows(tmp_path, batch_id)) == 2  # nothing of it ran after the window

    cancelled = CliRunner().invoke(cli, ["cancel", batch_id, "--redis-url", redis_url])
    assert cancelled.exit_code == 1 and "is expired; there is nothing left to cancel" in cancelled.stderr

    resumed = CliRunner().invoke(
        cli, ["submit", str(tmp_path / "d.jsonl"), "--redis-url", redis_url, "--resume", batch_id]
    )
    assert resumed.exit_code == 0, resumed.output
    record = batches.get_batch(conn, batch_id)
    assert record.status == "in_progress" and record.expires_at > time.time() + 1  # a new window, from now
    BatchWorker([queue_for(tiny_model)], **worker).work(burst=True)
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.cancelled) == ("completed", 6, 0)
    table, _ = results.collect(conn, batch_id)
    assert table.num_rows == 6 and table["error"].null_count == 6


def test_expiry_happens_once_under_its_lock(redis_url):
    conn = redis.Redis.from_url(redis_url)
    batch_id = batches.create_batch(
        conn, name="n", model="m", input_file="f", output="o", total=3, queue="miro:m", completion_window="1s"
    )
    batches.set_status(conn, batch_id, "in_progress")
    batches.count_finished(conn, batch_id, "a", prompt_tokens=5, cached_tokens=2, completion_tokens=3)
    later = batches.get_batch(conn, batch_id).expires_at + 0.1
    assert expiry.expire_due(conn, now=later - 0.2) == []  # not yet
    conn.set(keys.batch_expiry_lock(batch_id), "someone else")
    assert expiry.expire_due(conn, now=later) == []  # another holds the lock: it does the work
    conn.delete(keys.batch_expiry_lock(batch_id))
    assert expiry.expire_due(conn, now=later) == [batch_id]
    assert expiry.expire_due(conn, now=later) == []  # already expiring: swept again, not expired twice
    # nothing was queued (the batch has no jobs) and two requests are outstanding: a worker's abort counts them
    batches.count_cancelled(conn, batch_id, ["b", "c", "b"])
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.expired) == ("expired", 1, 2)
    assert (record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (5, 2, 3)
    assert conn.sismember(keys.ended_batches(), batch_id)
    assert expiry.expire_due(conn, now=later + 10) == [] and conn.zscore(keys.batch_deadlines(), batch_id) is None
