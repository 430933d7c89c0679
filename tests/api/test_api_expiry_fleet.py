"""A batch past its completion window mid-run on a real fleet (`miro serve`, a `miro worker` on the default model,
redis-server), through the openai SDK: what finished is kept and returned, the rest comes back as batch_expired
errors, the batch says expired, nothing of it runs after, and every object the server returns validates as the
SDK's own type (Batch with usage, FileObject, Completion)."""

from __future__ import annotations

import io
import json
import time

import pyarrow.parquet as pq
import pytest
import redis
from openai.types import Batch, Completion, FileObject
from polling import wait_for
from serve_process import jsonl

from miro.worker.fleet.records import batches

pytestmark = pytest.mark.slow

LINES = 1000
WINDOW_S = 20
PREFIX = (
    "You are a careful assistant who counts out loud, one number after another, without skipping any and "
    "without saying anything else. "
)  # shared by every prompt: the prefix cache serves it


def raw(client, path: str) -> dict:
    return client.get(path, cast_to=object)


def lines_of(client, file_id: str) -> list[dict]:
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_a_batch_past_its_window_mid_run(fleet):
    client = fleet.server.client()
    conn = redis.Redis.from_url(fleet.redis_url)
    assert wait_for(lambda: raw(client, "/workers")["data"], timeout_s=180), "the worker did not start"
    lines = [
        {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "smollm2-135m", "prompt": PREFIX + f"Count to {i}:", "max_tokens": 24},
        }
        for i in range(LINES)
    ]
    uploaded = client.files.create(file=("window.jsonl", jsonl(lines)), purpose="batch")
    FileObject.model_validate(raw(client, f"/files/{uploaded.id}"))
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/completions", completion_window=f"{WINDOW_S}s"
    )
    assert batch.expires_at == batch.created_at + WINDOW_S
    ended = wait_for(
        lambda: (b := Batch.model_validate(raw(client, f"/batches/{batch.id}"))).status == "expired" and b,
        timeout_s=WINDOW_S + 60,
        every_s=0.2,
    )
    assert ended, client.batches.retrieve(batch.id)
    record = batches.get_batch(conn, batch.id)
    counts, usage = ended.request_counts, ended.usage
    print(
        f"window {WINDOW_S} s: {counts.completed} of {LINES} completed, {record.expired} expired; expiring "
        f"{record.at('expiring') - record.expires_at:.2f} s after the window, expired "
        f"{record.at('expired') - record.expires_at:.2f} s after it; usage {usage.model_dump()}"
    )
    assert 0 < counts.completed < LINES and counts.total == LINES
    assert counts.failed == record.expired == LINES - counts.completed and record.failed == 0
    assert ended.expired_at >= ended.expires_at and ended.completed_at is None
    assert record.at("expired") - record.expires_at < 5  # the worker's round, and the aborts it counts

    output = lines_of(client, ended.output_file_id)
    errors = lines_of(client, ended.error_file_id)
    for file_id in (ended.output_file_id, ended.error_file_id):
        assert FileObject.model_validate(raw(client, f"/files/{file_id}")).purpose == "batch_output"
    assert len(output) == counts.completed and len(errors) == record.expired
    assert sorted(line["custom_id"] for line in output + errors) == sorted(line["custom_id"] for line in lines)
    completions = [Completion.model_validate(line["response"]["body"]) for line in output]
    assert all(c.choices[0].text is not None for c in completions)
    assert all(e["response"] is None and e["error"]["code"] == "batch_expired" for e in errors)
    # usage is summed once per custom id by the count that counted each request
    assert usage.input_tokens == sum(c.usage.prompt_tokens for c in completions)
    assert usage.output_tokens == sum(c.usage.completion_tokens for c in completions)
    assert usage.input_tokens_details.cached_tokens == sum(
        c.usage.prompt_tokens_details.cached_tokens for c in completions
    )
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0 and usage.input_tokens_details.cached_tokens > 0

    time.sleep(3)  # nothing of it runs after: no new row, the worker holds none of it
    status, body = fleet.server.get(f"/v1/batches/{batch.id}/results.parquet")
    table = pq.read_table(io.BytesIO(body))
    ran = [row for row in table.to_pylist() if row["error"] is None]
    assert status == 200 and table.num_rows == LINES and len(ran) == counts.completed
    assert all(row["started_at"].timestamp() <= record.expires_at + 0.01 for row in ran)
    assert sum(row["error_code"] == "batch_expired" for row in table.to_pylist()) == record.expired
    assert batches.get_batch(conn, batch.id).completed == counts.completed
    assert all(batch.id not in w["batches"] for w in raw(client, "/workers")["data"])
