"""Batch priorities on the queue side: the queue a batch goes to, its record, its jobs, and a bad priority."""

import json

import pytest
import redis
from click.testing import CliRunner
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from miro.cli.main import cli
from miro.core.errors import MiroError
from miro.worker.fleet.records import batches
from miro.worker.fleet.intake import routing
from miro.worker.fleet.records.payload import JobPayload
from miro.worker.fleet.intake.submit import submit

pytestmark = pytest.mark.usefixtures("one_request_per_job")  # they follow one request's RQ job


def dataset(path, n=3):
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"p{i}", "max_tokens": 2}) + "\n" for i in range(n)))
    return path


def queued_ids(conn, name) -> list[str]:
    return Queue(name, connection=conn, serializer=JSONSerializer).get_job_ids()


@pytest.mark.parametrize(
    "priority, queue",
    [("high", "miro:smollm2-135m/high"), ("normal", "miro:smollm2-135m"), ("low", "miro:smollm2-135m/low")],
)
def test_a_batch_goes_to_its_priority_queue_and_record(tmp_path, redis_url, priority, queue):
    conn = redis.Redis.from_url(redis_url)
    result = submit(conn, dataset(tmp_path / "d.jsonl"), priority=priority)
    assert (result.queue, result.priority) == (queue, priority)
    record = batches.get_batch(conn, result.batch_id)
    assert (record.queue, record.priority) == (queue, priority)
    ids = queued_ids(conn, queue)
    assert len(ids) == 3
    job = Job.fetch(ids[0], connection=conn, serializer=JSONSerializer)
    assert JobPayload.from_kwargs(job.kwargs).priority == priority
    others = [routing.priority_queue("miro:smollm2-135m", p) for p in routing.PRIORITIES if p != priority]
    assert all(queued_ids(conn, other) == [] for other in others)


def test_the_default_priority_is_normal_and_an_own_queue_gets_the_suffix(tmp_path, redis_url):
    conn = redis.Redis.from_url(redis_url)
    assert submit(conn, dataset(tmp_path / "d.jsonl")).queue == "miro:smollm2-135m"
    assert submit(conn, dataset(tmp_path / "d.jsonl"), queue_name="mine", priority="low").queue == "mine/low"


def test_resume_keeps_the_batch_priority_and_refuses_another(tmp_path, redis_url):
    conn = redis.Redis.from_url(redis_url)
    data = dataset(tmp_path / "d.jsonl")
    first = submit(conn, data, priority="high", queue_name="q")
    dataset(data, 5)
    again = submit(conn, data, resume=first.batch_id, queue_name="q")
    assert (again.queue, again.priority, again.enqueued) == ("q/high", "high", 2)
    with pytest.raises(MiroError, match="uses priority 'high', not 'low'"):
        submit(conn, data, resume=first.batch_id, priority="low")


def test_a_bad_priority_is_one_sentence(tmp_path):
    with pytest.raises(MiroError, match=r"^The priority 'urgent' is not one of high, normal, low\.$"):
        submit(None, dataset(tmp_path / "d.jsonl"), priority="urgent", dry_run=True)


def test_workers_listen_to_every_high_queue_first():
    assert routing.worker_queues(["miro:a", "miro:b"]) == [
        "miro:a/high",
        "miro:b/high",
        "miro:a",
        "miro:b",
        "miro:a/low",
        "miro:b/low",
    ]
    assert routing.worker_queues(["x/low", "y"]) == ["y/high", "y", "x/low", "y/low"]
    # a model named high or low (or x:low) has queues of its own, at every priority
    assert routing.worker_queues([routing.queue_for("high"), routing.queue_for("x:low.gguf")]) == [
        "miro:high/high",
        "miro:x:low/high",
        "miro:high",
        "miro:x:low",
        "miro:high/low",
        "miro:x:low/low",
    ]
    assert [routing.queue_priority(q) for q in ("miro:high", "miro:low", "miro:high/low")] == [
        "normal",
        "normal",
        "low",
    ]
    assert [routing.engine_priority(p) for p in routing.PRIORITIES] == [-1, 0, 1]


def test_miro_status_shows_the_priority(tmp_path, redis_url):
    conn = redis.Redis.from_url(redis_url)
    normal = submit(conn, dataset(tmp_path / "d.jsonl")).batch_id
    status = CliRunner().invoke(cli, ["status", "--redis-url", redis_url], env={"COLUMNS": "200"})
    assert status.exit_code == 0 and "priority" not in status.output  # no column while every batch is normal
    high = submit(conn, dataset(tmp_path / "d.jsonl"), priority="high").batch_id
    status = CliRunner().invoke(cli, ["status", "--redis-url", redis_url], env={"COLUMNS": "200"})
    rows = {line.split()[0]: line.split() for line in status.output.splitlines() if line.startswith("batch_")}
    assert "priority" in status.output and (rows[high][3], rows[normal][3]) == ("high", "normal")
    details = CliRunner().invoke(cli, ["status", high, "--redis-url", redis_url, "--json"])
    assert json.loads(details.output)["batch"]["priority"] == "high"
