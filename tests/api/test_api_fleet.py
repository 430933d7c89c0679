"""A real fleet behind the API: `miro serve`, one `miro worker` on the default model, redis-server. A 1,000-line
batch end to end through the openai SDK, each output line read with the SDK's own types; cancelling mid-batch;
results.parquet, /v1/workers and /metrics; the batch as miro's own commands see it."""

from __future__ import annotations

import io
import json
import time

import pyarrow.parquet as pq
import pytest
import redis
from click.testing import CliRunner
from serve_process import chat_line, jsonl
from openai.types import Completion
from openai.types.chat import ChatCompletion
from polling import wait_for

from miro.cli.main import cli
from miro.worker.fleet.records import batches

pytestmark = pytest.mark.slow

LINES = 1000


def run_to_end(client, batch_id: str, timeout_s: float = 240):
    ended = wait_for(
        lambda: (b := client.batches.retrieve(batch_id)).status in ("completed", "failed", "cancelled") and b,
        timeout_s=timeout_s,
        every_s=0.5,
    )
    assert ended, f"batch {batch_id} did not end: {client.batches.retrieve(batch_id)}"
    return ended


def output_lines(client, file_id: str) -> list[dict]:
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_a_thousand_line_chat_batch_end_to_end(fleet):
    client = fleet.server.client()
    lines = [chat_line(i, max_tokens=4) for i in range(LINES)]
    uploaded = client.files.create(file=("thousand.jsonl", jsonl(lines)), purpose="batch")
    started = time.monotonic()
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"run": "e2e"}
    )
    batch = run_to_end(client, batch.id)
    print(f"{LINES} chat requests in {time.monotonic() - started:.1f} s")
    assert batch.status == "completed" and batch.completed_at >= batch.in_progress_at
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (
        LINES,
        LINES,
        0,
    )
    assert batch.error_file_id is None and batch.output_file_id

    output = client.files.retrieve(batch.output_file_id)
    assert output.purpose == "batch_output" and output.filename == f"{batch.id}_output.jsonl"
    got = output_lines(client, batch.output_file_id)
    assert [line["custom_id"] for line in got] == [line["custom_id"] for line in lines]  # input order
    for line in got:
        assert line["error"] is None and line["response"]["status_code"] == 200
        completion = ChatCompletion.model_validate(line["response"]["body"])
        assert completion.model == "smollm2-135m" and completion.choices[0].message.role == "assistant"
        assert 1 <= completion.usage.completion_tokens <= 4 and completion.choices[0].message.content is not None

    status, body = fleet.server.get(f"/v1/batches/{batch.id}/results.parquet")
    table = pq.read_table(io.BytesIO(body))
    assert status == 200 and table.num_rows == LINES and table["error"].null_count == LINES
    assert table["custom_id"].to_pylist() == [line["custom_id"] for line in lines]

    shown = CliRunner().invoke(cli, ["status", batch.id, "--json", "--redis-url", fleet.redis_url])
    assert shown.exit_code == 0 and json.loads(shown.stdout)["batch"]["completed"] == LINES


def test_cancelling_mid_batch(fleet):
    client = fleet.server.client()
    lines = [
        {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "smollm2-135m", "prompt": f"Count to {i}:", "max_tokens": 24},
        }
        for i in range(400)
    ]
    uploaded = client.files.create(file=("long.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h")
    assert wait_for(lambda: client.batches.retrieve(batch.id).request_counts.completed > 0, timeout_s=120)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at is not None
    batch = run_to_end(client, batch.id, timeout_s=60)
    counts = batch.request_counts
    assert batch.status == "cancelled" and 0 < counts.completed < counts.total == 400 and counts.failed == 0
    record = batches.get_batch(redis.Redis.from_url(fleet.redis_url), batch.id)
    assert record.status == "cancelled" and record.completed + record.cancelled == 400
    got = output_lines(client, batch.output_file_id)
    assert len(got) == counts.completed
    for line in got:
        assert Completion.model_validate(line["response"]["body"]).choices[0].text is not None


def test_workers_and_metrics(fleet):
    client = fleet.server.client()
    assert wait_for(lambda: client.get("/workers", cast_to=object)["data"], timeout_s=120)
    (worker,) = client.get("/workers", cast_to=object)["data"]
    assert (worker["name"], worker["model"]) == ("api-worker", "smollm2-135m")
    assert worker["weight_format"] in ("f32", "native") and worker["kv_blocks_total"] > 0
    assert 0 <= worker["kv_usage"] <= 1 and worker["tokens_per_s"] >= 0
    status, body = fleet.server.get("/metrics")
    text = body.decode()
    assert status == 200
    assert 'miro:kv_cache_usage_perc{model_name="smollm2-135m",worker="api-worker"}' in text
    assert 'miro:batches{status="completed"}' in text
