"""Queue names no model name can collide with, on a real redis-server and BatchWorkers on tiny models: a model
named `high` runs its normal and low batches, and jobs an earlier version queued on `Q:high` move to `Q/high`
when a worker starts, while a model named `Q:high` keeps its own."""

import json

import pytest
import redis
from gguf_factory import write_tiny_llama
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from miro.worker import BatchWorker
from miro.worker.fleet.records import batches
from miro.worker.fleet.intake import routing
from miro.worker.fleet.intake.routing import queue_for
from miro.worker.fleet.intake.submit import submit

pytestmark = pytest.mark.usefixtures("one_request_per_job")  # they follow one request's RQ job


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """Tiny models whose names look like priorities: `high`, `low`, `tiny` and `tiny:high`."""
    folder = tmp_path_factory.mktemp("named")
    return {
        name: str(write_tiny_llama(folder / f"{name}.gguf", tensor_type="Q8_0")["path"])
        for name in ("high", "low", "tiny", "tiny:high")
    }


def dataset(path, n: int = 2):
    path.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"hi {i}", "max_tokens": 2}) + "\n" for i in range(n)))
    return path


def run_worker(conn, model: str) -> BatchWorker:
    worker = BatchWorker(
        [queue_for(model)],
        connection=conn,
        serializer=JSONSerializer,
        model=model,
        engine_options={"kv_cache_memory": "4MiB"},
    )
    worker.work(burst=True)
    return worker


def queued(conn, name: str) -> list[str]:
    return Queue(name, connection=conn, serializer=JSONSerializer).get_job_ids()


def test_models_named_high_and_low_run_at_every_priority(tmp_path, redis_url, models):
    conn = redis.Redis.from_url(redis_url)
    made = {
        (name, priority): submit(
            conn, dataset(tmp_path / "d.jsonl"), model=models[name], priority=priority, output=str(tmp_path / "out")
        )
        for name in ("high", "low")
        for priority in ("high", "normal", "low")
    }
    assert made[("high", "normal")].queue == "miro:high" and made[("low", "high")].queue == "miro:low/high"
    for name in ("high", "low"):
        run_worker(conn, models[name])
    assert {key: batches.get_batch(conn, r.batch_id).status for key, r in made.items()} == dict.fromkeys(
        made, "completed"
    )


def test_jobs_on_an_earlier_versions_priority_queue_move_to_todays(tmp_path, redis_url, models):
    conn = redis.Redis.from_url(redis_url)
    out = str(tmp_path / "out")
    legacy = submit(conn, dataset(tmp_path / "a.jsonl"), model=models["tiny"], priority="high", output=out)
    # as an earlier version queued it: on miro:tiny:high, recorded so, each job's origin that queue
    old_name = "miro:tiny:high"
    conn.rename(Queue(legacy.queue, connection=conn).key, Queue(old_name, connection=conn).key)
    conn.hset(batches.BatchRecord.key(legacy.batch_id), "queue", old_name)
    for job_id in queued(conn, old_name):
        conn.hset(Job.key_for(job_id), "origin", old_name)
    # today a model named tiny:high has that very queue for its normal batches: its jobs are not tiny's
    own = submit(conn, dataset(tmp_path / "b.jsonl"), model=models["tiny:high"], output=out)
    assert own.queue == old_name and len(queued(conn, old_name)) == 4

    run_worker(conn, models["tiny"])
    record = batches.get_batch(conn, legacy.batch_id)
    assert (record.status, record.queue) == ("completed", "miro:tiny/high")
    assert [
        Job.fetch(j, connection=conn, serializer=JSONSerializer).meta["batch_id"] for j in queued(conn, old_name)
    ] == [own.batch_id, own.batch_id]  # left where they are
    run_worker(conn, models["tiny:high"])
    assert batches.get_batch(conn, own.batch_id).status == "completed"

    # a batch recorded under an old name with nothing queued gets today's name when it runs again
    conn.hset(batches.BatchRecord.key(legacy.batch_id), "queue", old_name)
    assert routing.upgraded_queue(old_name, "high") == "miro:tiny/high"
    assert routing.upgraded_queue(old_name, "normal") == old_name  # tiny:high's own normal queue
    resumed = submit(conn, tmp_path / "a.jsonl", resume=legacy.batch_id)
    assert resumed.queue == "miro:tiny/high" and batches.get_batch(conn, legacy.batch_id).queue == "miro:tiny/high"
