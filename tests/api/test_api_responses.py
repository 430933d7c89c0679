"""A /v1/responses batch through `miro serve` with the unmodified openai SDK: batches.create with endpoint
/v1/responses, a `miro worker` on a tiny GGUF, then files.content's output lines, each body read as the SDK's
Response; a line the Responses endpoint refuses fails the batch naming it."""

from __future__ import annotations

import json
import subprocess

from openai.types.responses import Response
from polling import wait_for
from serve_process import MIRO, environment, jsonl


def responses_line(custom_id: str, model: str, **body) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/responses",
        "body": {"model": model, "input": "Hi.", "max_output_tokens": 6, **body},
    }


def test_a_responses_batch_through_the_openai_sdk(serve, redis_url, tiny_model, tmp_path):
    client = serve(redis_url).client()
    refused = [responses_line("ok", tiny_model), responses_line("tool", tiny_model, tools=[{"type": "web_search"}])]
    file_id = client.files.create(file=("refused.jsonl", jsonl(refused)), purpose="batch").id
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/responses", completion_window="24h")
    assert batch.status == "failed"
    assert [(e.line, e.message) for e in batch.errors.data] == [
        (
            2,
            "line 2: field 'body': 'tools' is not supported by miro yet, and ignoring it would change the answer: "
            "remove it or set it to null.",
        )
    ]

    lines = [
        responses_line("plain", tiny_model, instructions="Be brief.", metadata={"run": "sdk"}),
        responses_line("json", tiny_model, max_output_tokens=20, text={"format": {"type": "json_object"}}),
    ]
    file_id = client.files.create(file=("responses.jsonl", jsonl(lines)), purpose="batch").id
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/responses", completion_window="24h")
    assert (batch.status, batch.endpoint) == ("in_progress", "/v1/responses")
    with open(tmp_path / "worker.log", "w") as log:
        worker = subprocess.run(
            [
                *MIRO,
                "worker",
                "--redis-url",
                redis_url,
                "--model",
                tiny_model,
                "--burst",
                "--kv-cache-memory",
                "8MiB",
                "--threads",
                "1",
            ],
            env=environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=300,
        )
    assert worker.returncode == 0, (tmp_path / "worker.log").read_text()
    batch = wait_for(lambda: (b := client.batches.retrieve(batch.id)).status == "completed" and b, timeout_s=60)
    assert batch and (batch.request_counts.completed, batch.request_counts.failed) == (2, 0)

    got = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
    assert [line["custom_id"] for line in got] == ["plain", "json"]
    assert all(line["response"]["status_code"] == 200 and line["error"] is None for line in got)
    plain, constrained = (Response.model_validate(line["response"]["body"]) for line in got)
    assert (plain.instructions, plain.metadata, plain.max_output_tokens) == ("Be brief.", {"run": "sdk"}, 6)
    assert plain.output[0].content[0].type == "output_text" and plain.usage.output_tokens > 0
    assert plain.status in ("completed", "incomplete")
    assert constrained.text.format.type == "json_object"
    if constrained.status == "completed":  # a JSON object, as the structured-output engine makes it
        assert isinstance(json.loads(constrained.output_text), dict)
