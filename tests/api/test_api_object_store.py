"""`miro serve --storage s3://...` against a real S3-compatible server (SeaweedFS, tests/s3_server.py): uploads
stream into the bucket, the batch is validated from a local copy, the workers' part files, the output file and
results.parquet all come from the bucket. The worker is a tiny model serving the name the lines ask for."""

from __future__ import annotations

import io
import json

import pyarrow.parquet as pq
import redis
import s3_server
from serve_process import jsonl
from openai.types import Completion
from rq.serializers import JSONSerializer

from miro.worker import BatchWorker
from miro.worker.fleet.intake.routing import queue_for

s3_endpoint, s3 = s3_server.s3_endpoint, s3_server.s3  # the fixtures, for this module's tests


def test_a_batch_with_its_files_in_an_object_store(serve, redis_url, s3, tiny_model):
    storage = s3.url("miro")
    server = serve(redis_url, storage=storage)
    client = server.client()
    lines = [
        {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "smollm2-135m", "prompt": f"hello {i}", "max_tokens": 3},
        }
        for i in range(6)
    ]
    lines[4]["body"]["prompt"] = "hello " * 200  # over the tiny model's context: that request fails
    uploaded = client.files.create(file=("lines.jsonl", jsonl(lines)), purpose="batch")
    assert s3.files("miro") == [f"files/{uploaded.id}"]
    assert client.files.content(uploaded.id).content == jsonl(lines)
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h")
    assert batch.status == "in_progress" and batch.request_counts.total == 6

    conn = redis.Redis.from_url(redis_url)
    BatchWorker(
        [queue_for("smollm2-135m")],
        connection=conn,
        serializer=JSONSerializer,
        model=tiny_model,
        served_model_names=["smollm2-135m"],
        engine_options={"kv_cache_memory": "4MiB"},
        flush_rows=2,
    ).work(burst=True)
    batch = client.batches.retrieve(batch.id)
    counts = batch.request_counts
    assert batch.status == "completed" and (counts.completed, counts.failed) == (5, 1)
    stored = s3.files("miro")
    assert any(name.startswith(f"batches/{batch.id}/part-") for name in stored)
    assert {f"files/{batch.output_file_id}", f"files/{batch.error_file_id}"} <= set(stored)
    got = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
    assert [line["custom_id"] for line in got] == ["c0", "c1", "c2", "c3", "c5"]
    for line in got:
        assert Completion.model_validate(line["response"]["body"]).usage.completion_tokens <= 3
    (failed,) = [json.loads(line) for line in client.files.content(batch.error_file_id).text.splitlines()]
    assert failed["custom_id"] == "c4" and failed["response"] is None and failed["error"]["code"] == "request_failed"
    status, body = server.get(f"/v1/batches/{batch.id}/results.parquet")
    assert status == 200 and pq.read_table(io.BytesIO(body)).num_rows == 6
