"""An embeddings batch through `miro serve` with the unmodified openai SDK: files.create, batches.create with
endpoint /v1/embeddings, a `miro worker` on all-MiniLM-L6-v2, then files.content's output lines, each body read
as the SDK's CreateEmbeddingResponse."""

from __future__ import annotations

import base64
import json
import subprocess

import numpy as np
import pytest
from openai.types import CreateEmbeddingResponse
from polling import wait_for
from serve_process import MIRO, chat_line, environment, jsonl

from miro.core import Engine

MODEL = "all-minilm-l6-v2"
TEXTS = ["The SDK reads these lines.", "Each body is a CreateEmbeddingResponse."]


def embeddings_line(custom_id: str, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL, **body}}


@pytest.mark.slow
def test_an_embeddings_batch_through_the_openai_sdk(serve, redis_url, minilm_path, tmp_path):
    client = serve(redis_url).client()
    lines = [
        embeddings_line("texts", input=TEXTS),
        embeddings_line("b64", input=TEXTS[0], encoding_format="base64"),
        embeddings_line("blank", input=""),
    ]
    file_id = client.files.create(file=("corpus.jsonl", jsonl(lines)), purpose="batch").id
    refused = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")
    assert refused.status == "failed"
    assert [e.message for e in refused.errors.data] == ["line 3: field 'body.input': input 0 is an empty string."]

    file_id = client.files.create(file=("corpus.jsonl", jsonl(lines[:2])), purpose="batch").id
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")
    assert (batch.status, batch.endpoint, batch.model) == ("in_progress", "/v1/embeddings", MODEL)
    with open(tmp_path / "worker.log", "w") as log:
        worker = subprocess.run(
            [*MIRO, "worker", "--redis-url", redis_url, "--model", MODEL, "--burst"],
            env=environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=300,
        )
    assert worker.returncode == 0, (tmp_path / "worker.log").read_text()
    batch = wait_for(lambda: (b := client.batches.retrieve(batch.id)).status == "completed" and b, timeout_s=60)
    assert batch and (batch.request_counts.completed, batch.request_counts.failed) == (2, 0)
    assert batch.error_file_id is None

    got = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
    assert [line["custom_id"] for line in got] == ["texts", "b64"]
    texts = CreateEmbeddingResponse.model_validate(got[0]["response"]["body"])
    encoded = got[1]["response"]["body"]  # base64: a string the SDK decodes as little-endian float32
    expected = Engine.from_model(MODEL).embed(TEXTS)
    assert texts.model == MODEL and [d.index for d in texts.data] == [0, 1] and texts.usage.total_tokens > 0
    np.testing.assert_allclose([d.embedding for d in texts.data], expected, atol=1e-5)
    vector = np.frombuffer(base64.b64decode(encoded["data"][0]["embedding"]), "<f4")
    np.testing.assert_allclose(vector, expected[0], atol=1e-5)


def test_an_embeddings_batch_refuses_chat_lines(serve, redis_url):
    client = serve(redis_url).client()
    file_id = client.files.create(
        file=("mixed.jsonl", jsonl([embeddings_line("e", input="a"), chat_line(1)])), purpose="batch"
    ).id
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")
    assert batch.status == "failed"
    assert [(e.line, e.code) for e in batch.errors.data] == [(2, "url_mismatch")]
