"""`reuse_batch_id` on POST /v1/batches (batch_reuse.py) over real HTTP, a real redis-server and the tiny model: a
second batch takes the first's rows of its unchanged deterministic requests and says how many, its output file holds
them as a run would; a sampled request without a seed and an edited one run again; and every value that cannot be
reused is a 4xx in one sentence."""

from __future__ import annotations

import io
import json
import shutil

import openai
import pyarrow.parquet as pq
import pytest
import redis
from polling import wait_for
from rq.serializers import JSONSerializer
from serve_process import jsonl

from miro.worker import BatchWorker
from miro.worker.fleet.intake.routing import queue_for
from miro.worker.fleet.records import batches, keys

# the columns that say how and when a row was made, not what it is: a reused row keeps its first run's
RUN_COLUMNS = {"batch_id", "job_id", "worker", "started_at", "finished_at", "latency_s", "cached_tokens", "reused_from"}


def line(custom_id: str, model: str, content: str, **sampling) -> dict:
    body = {"model": model, "max_tokens": 3, "messages": [{"role": "user", "content": content}], **sampling}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def lines(model: str, edited: bool = False) -> list[dict]:
    return [
        line("greedy", model, "hello world", temperature=0),
        line("seeded", model, "the world", temperature=0.9, seed=7, n=2),
        line("sampled", model, "hello the", temperature=1.0),  # no seed: never reused
        line("edited", model, "hello again" if edited else "hello", temperature=0),
    ]


def upload(client, body: list[dict]) -> str:
    return client.files.create(file=("d.jsonl", jsonl(body)), purpose="batch").id


def create(client, file_id: str, reuse: object | None = None):
    extra = {"reuse_batch_id": reuse} if reuse is not None else None
    return client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h", extra_body=extra
    )


def run_worker(redis_url: str, model: str) -> None:
    BatchWorker(
        [queue_for(model)],
        connection=redis.Redis.from_url(redis_url),
        serializer=JSONSerializer,
        model=model,
        engine_options={"kv_cache_memory": "4MiB"},
    ).work(burst=True)


def ended(client, redis_url: str, batch_id: str):
    """The batch once its run has ended and its result files are written."""
    conn = redis.Redis.from_url(redis_url)
    assert wait_for(lambda: conn.hget(keys.api_batch(batch_id), "files_for"), timeout_s=30, every_s=0.1)
    return client.batches.retrieve(batch_id)


def rows(server, batch_id: str) -> dict[tuple[str, int], dict]:
    status, data = server.get(f"/v1/batches/{batch_id}/results.parquet")
    assert status == 200
    return {(r["custom_id"], r["choice_index"]): r for r in pq.read_table(io.BytesIO(data)).to_pylist()}


def output_lines(client, batch) -> dict[str, dict]:
    return {e["custom_id"]: e for e in map(json.loads, client.files.content(batch.output_file_id).text.splitlines())}


def test_a_second_batch_reuses_the_firsts_deterministic_rows(serve, redis_url, tiny_model):
    server = serve(redis_url)
    client = server.client()
    first = create(client, upload(client, lines(tiny_model)))
    assert first.reuse_batch_id is None and first.request_counts.reused is None
    run_worker(redis_url, tiny_model)
    first = ended(client, redis_url, first.id)
    assert (first.status, first.request_counts.completed) == ("completed", 4)

    second = create(client, upload(client, lines(tiny_model, edited=True)), reuse=first.id)
    assert second.reuse_batch_id == first.id
    counts = second.request_counts
    assert (counts.total, counts.completed, counts.reused) == (4, 2, 2)  # greedy and seeded; the others wait
    run_worker(redis_url, tiny_model)
    second = ended(client, redis_url, second.id)
    assert (second.status, second.request_counts.completed, second.request_counts.reused) == ("completed", 4, 2)

    a, b = rows(server, first.id), rows(server, second.id)
    assert {key: row["reused_from"] for key, row in b.items()} == {
        ("greedy", 0): first.id,
        ("seeded", 0): first.id,
        ("seeded", 1): first.id,
        ("sampled", 0): None,
        ("edited", 0): None,
    }
    for key in [("greedy", 0), ("seeded", 0), ("seeded", 1)]:
        assert b[key]["batch_id"] == second.id and b[key]["job_id"] == batches.job_id(second.id, key[0])
        for column in b[key]:
            if column not in RUN_COLUMNS:
                assert b[key][column] == a[key][column], (key, column)
    assert b[("edited", 0)]["prompt"] != a[("edited", 0)]["prompt"]

    old, new = output_lines(client, first), output_lines(client, second)
    assert list(new) == ["greedy", "seeded", "sampled", "edited"]  # in input order
    for custom_id in ("greedy", "seeded"):
        assert new[custom_id]["response"]["body"]["choices"] == old[custom_id]["response"]["body"]["choices"]
        assert new[custom_id]["response"]["body"]["usage"] == old[custom_id]["response"]["body"]["usage"]
        assert new[custom_id]["response"]["request_id"] == batches.job_id(second.id, custom_id)


def refusal(client, file_id: str, reuse: object, error=openai.BadRequestError) -> str:
    with pytest.raises(error) as err:
        create(client, file_id, reuse)
    assert err.value.body["param"] == "reuse_batch_id"
    return err.value.body["message"]


def test_what_cannot_be_reused_is_a_4xx_in_one_sentence(serve, redis_url, tiny_model, tmp_path):
    server = serve(redis_url)
    client = server.client()
    conn = redis.Redis.from_url(redis_url)
    file_id = upload(client, lines(tiny_model))

    assert refusal(client, file_id, "batch_nope") == (
        "reuse_batch_id 'batch_nope' is not a batch id (they look like batch_ followed by 24 hex digits)."
    )
    assert refusal(client, file_id, 5) == "reuse_batch_id: Input should be a valid string."
    unknown = "batch_" + "0" * 24
    assert refusal(client, file_id, unknown, openai.NotFoundError) == f"No batch with id '{unknown}' on this server."

    running = create(client, file_id)  # no worker: it stays in progress
    assert refusal(client, file_id, running.id) == (
        f"Batch {running.id} is in_progress: its results can be reused once it has ended "
        "(completed, cancelled or expired)."
    )
    failed = create(client, upload(client, [{"custom_id": "x", "method": "POST"}]))
    assert failed.status == "failed"
    assert refusal(client, file_id, failed.id) == f"Batch {failed.id} failed validation: it has no results to reuse."

    client.batches.cancel(running.id)  # ended, with no rows
    assert wait_for(lambda: batches.get_batch(conn, running.id).status == "cancelled", timeout_s=10)
    made = conn.zcard(keys.batches())
    assert refusal(client, upload(client, lines("smollm2-135m")), running.id) == (
        f"The results to reuse were made with '{tiny_model}', but line 1 names 'smollm2-135m': a batch reuses only "
        "rows of the model it runs on, so its lines must name that model; nothing was enqueued."
    )
    assert conn.zcard(keys.batches()) == made  # the refused batch left nothing
    reusing = create(client, file_id, running.id)  # the same batch on its own model: accepted, nothing to reuse
    assert (reusing.status, reusing.request_counts.reused, reusing.reuse_batch_id) == ("in_progress", 0, running.id)

    assert wait_for(lambda: conn.hget(keys.api_batch(running.id), "files_for"), timeout_s=10)  # none: no rows
    part = f"{batches.get_batch(conn, running.id).output}/{running.id}/part-000001.parquet"
    with open(part, "wb") as f:
        f.write(b"PAR1 not a results table")
    message = refusal(client, file_id, running.id)
    assert message.startswith(f"The results of batch {running.id} cannot be reused: ") and "\n" not in message

    gone = tmp_path / "gone.gguf"
    shutil.copy(tiny_model, gone)
    elsewhere = create(client, upload(client, lines(str(gone))))
    client.batches.cancel(elsewhere.id)
    assert wait_for(lambda: batches.get_batch(conn, elsewhere.id).status == "cancelled", timeout_s=10)
    gone.unlink()
    assert refusal(client, file_id, elsewhere.id) == (
        f"Batch {elsewhere.id} ran on '{gone}', which is no model file on this server, so its rows cannot be "
        "compared by the file's sha256."
    )
