"""/v1/responses lines on real parts: how each field becomes a chat request (instructions, input forms,
max_output_tokens, text.format through the structured-output engine, metadata), their errors in one sentence,
and a batch through miro submit, a BatchWorker on a tiny GGUF and miro results, whose output lines the openai
SDK's Response type reads and whose Parquet rows have a chat batch's columns."""

import json
import os
import subprocess
import sys

import jsonschema
import pyarrow.parquet as pq
import pytest
import redis
from click.testing import CliRunner
from openai.types.responses import Response
from rq import Queue
from rq.serializers import JSONSerializer

from input_lines import parse
from miro.cli.main import cli
from miro.worker import BatchWorker
from miro.worker.fleet.records.payload import ResponseEcho
from miro.worker.fleet.intake.routing import queue_for

URL = "/v1/responses"
OK = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
SCHEMA_FORMAT = {"type": "json_schema", "name": "verdict", "schema": OK, "strict": True}


def line(custom_id="r1", **body):
    return {"custom_id": custom_id, "method": "POST", "url": URL, "body": {"input": "hi", **body}}


def test_a_responses_line_is_a_chat_request_with_its_echo(tmp_path):
    given = line(
        "r1",
        model="gpt-4o-mini",
        instructions="Answer in French.",
        max_output_tokens=7,
        temperature=0.3,
        top_p=0.9,
        seed=4,
        metadata={"team": "a"},
        text={"format": SCHEMA_FORMAT, "verbosity": "low"},
        store=False,
        user="u1",
    )
    (request,) = parse(tmp_path, given).requests
    assert (request.kind, request.task, request.url, request.requested_model) == (
        "response",
        "generate",
        URL,
        "gpt-4o-mini",
    )
    assert request.messages == [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "hi"}]
    assert request.sampling == {
        "max_tokens": 7,
        "temperature": 0.3,
        "top_p": 0.9,
        "seed": 4,
        "structured_outputs": {"json": OK},
    }
    assert request.response == ResponseEcho(
        instructions="Answer in French.", metadata={"team": "a"}, text_format=SCHEMA_FORMAT
    )


def test_input_as_message_items_with_input_text_parts(tmp_path):
    items = [
        {"type": "message", "role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "first"}, {"type": "input_text", "text": "x"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "ok", "annotations": []}]},
        {"role": "user", "content": "again"},
    ]
    (request,) = parse(tmp_path, line(input=items, text={"format": {"type": "json_object"}})).requests
    assert request.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first\nx"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "again"},
    ]
    assert request.sampling == {"max_tokens": None, "structured_outputs": {"json_object": True}}
    (plain,) = parse(tmp_path, line(text={"format": {"type": "text"}})).requests
    assert "structured_outputs" not in plain.sampling and plain.response.text_format == {"type": "text"}


@pytest.mark.parametrize(
    "body, message",
    [
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "field 'body.input.0.content': content parts of type 'input_image' are not supported (input_text or "
            "output_text only)",
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "c", "output": "4"}]},
            "field 'body.input': input items of type 'function_call_output' are not supported (messages only)",
        ),
        ({"input": []}, "field 'body.input': List should have at least 1 item after validation, not 0"),
        ({"instructions": "x"}, "field 'body.input': Field required"),
        (
            {"input": "x", "tools": [{"type": "web_search"}]},
            "field 'body': 'tools' is not supported by miro yet, and ignoring it would change the answer: remove it or "
            "set it to null",
        ),
        (
            {"input": "x", "previous_response_id": "resp_1"},
            "field 'body': 'previous_response_id' is not supported by miro yet, and ignoring it would change the answer: "
            "remove it or set it to null",
        ),
        (
            {"input": "x", "n": 2},
            "field 'body.n': a Responses request gives one output; use /v1/chat/completions lines for n choices",
        ),
        (
            {"input": "x", "max_tokens": 4, "max_output_tokens": 5},
            "field 'body.max_output_tokens': differs from 'body.max_tokens', give only one",
        ),
        (
            {"input": "x", "text": {"format": {"type": "json_schema", "schema": OK}}},
            "field 'body.text.format': type 'json_schema' needs a 'name' and a 'schema'",
        ),
        (
            {"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "objekt"}}}},
            "field 'body.text.format.schema' does not compile: Invalid type: objekt",
        ),
        (
            {"input": "x", "text": {"format": {"type": "json_object"}}, "structured_outputs": {"regex": "a"}},
            "field 'body.text.format': give it or 'body.structured_outputs', not both",
        ),
        (
            {"input": "x", "top_logprobs": 2},
            "field 'body.top_logprobs': needs 'include' to list 'message.output_text.logprobs'",
        ),
        (
            {"input": "x", "include": ["file_search_call.results"]},
            "field 'body.include': 'file_search_call.results' is not supported (only 'message.output_text.logprobs')",
        ),
        ({"input": "x", "metadata": {"n": 1}}, "field 'body.metadata.n': Input should be a valid string"),
    ],
)
def test_a_responses_line_miro_cannot_run_is_one_sentence(tmp_path, body, message):
    result = parse(tmp_path, {"custom_id": "bad", "method": "POST", "url": URL, "body": body})
    assert [(e.custom_id, e.message) for e in result.errors] == [("bad", f"line 1: {message}.")]


def run_batch(tmp_path, redis_url, model, lines):
    """Submit the lines, run them on one BatchWorker in burst mode; the merged results as (Parquet table, output
    lines, error lines)."""
    dataset = tmp_path / f"{len(list(tmp_path.iterdir()))}.jsonl"
    dataset.write_text("".join(json.dumps(x) + "\n" for x in lines))
    runner = CliRunner()
    submitted = runner.invoke(
        cli, ["submit", str(dataset), "--redis-url", redis_url, "--model", model, "--output", str(tmp_path / "parts")]
    )
    assert submitted.exit_code == 0, submitted.output
    batch_id = submitted.stdout.strip()
    conn = redis.Redis.from_url(redis_url)
    BatchWorker(
        [Queue(queue_for(model), connection=conn, serializer=JSONSerializer)],
        connection=conn,
        serializer=JSONSerializer,
        model=model,
        engine_options={"kv_cache_memory": "8MiB"},
    ).work(burst=True, logging_level="WARNING")
    for fmt in ("parquet", "jsonl"):
        merged = runner.invoke(
            cli,
            ["results", batch_id, "-o", str(tmp_path / f"{batch_id}.{fmt}"), "--format", fmt, "--redis-url", redis_url],
        )
        assert merged.exit_code == 0, merged.output
    read = lambda path: [json.loads(x) for x in path.read_text().splitlines()]  # noqa: E731
    return (
        pq.read_table(tmp_path / f"{batch_id}.parquet"),
        read(tmp_path / f"{batch_id}.jsonl"),
        read(tmp_path / f"{batch_id}.errors.jsonl"),
    )


def test_a_responses_batch_gives_response_objects_the_sdk_validates(tmp_path, redis_url, tiny_model):
    lines = [
        line(
            "schema",
            instructions="Reply as JSON.",
            max_output_tokens=40,
            temperature=0,
            metadata={"k": "v"},
            text={"format": SCHEMA_FORMAT},
        ),
        line(
            "cut",
            input=[{"role": "user", "content": [{"type": "input_text", "text": "go on"}]}],
            max_output_tokens=2,
            temperature=0,
            include=["message.output_text.logprobs"],
            top_logprobs=2,
        ),
        line("long", input="x " * 200, max_output_tokens=4),
    ]  # over the tiny model's 128-token context
    table, responses, errors = run_batch(tmp_path, redis_url, tiny_model, lines)
    assert [x["custom_id"] for x in responses] == ["schema", "cut"]
    schema_line, cut_line = responses
    assert schema_line["id"] == f"batch_req_{schema_line['response']['request_id']}"
    schema, cut = (Response.model_validate(x["response"]["body"]) for x in responses)
    assert (schema.object, schema.status, schema.instructions, schema.metadata) == (
        "response",
        "completed",
        "Reply as JSON.",
        {"k": "v"},
    )
    assert schema.incomplete_details is None and schema.error is None
    assert (schema.max_output_tokens, schema.temperature, schema.top_p) == (40, 0.0, 1.0)
    assert schema.text.format.type == "json_schema" and schema.text.format.name == "verdict"
    [message] = schema.output
    assert (message.type, message.role, message.status, message.content[0].type) == (
        "message",
        "assistant",
        "completed",
        "output_text",
    )
    jsonschema.validate(json.loads(schema.output_text), OK)  # the structured-output engine held it to the schema
    rows = {r["custom_id"]: r for r in table.to_pylist()}
    assert schema.output_text == rows["schema"]["output"] and json.loads(rows["schema"]["parsed"]) == json.loads(
        schema.output_text
    )
    usage = schema.usage
    assert (usage.input_tokens, usage.output_tokens, usage.input_tokens_details.cached_tokens) == (
        rows["schema"]["prompt_tokens"],
        rows["schema"]["completion_tokens"],
        rows["schema"]["cached_tokens"],
    )
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert schema.model.endswith("tiny") or schema.model == rows["schema"]["model"]

    assert (cut.status, cut.incomplete_details.reason, cut.usage.output_tokens) == (
        "incomplete",
        "max_output_tokens",
        2,
    )
    logprobs = cut.output[0].content[0].logprobs
    assert len(logprobs) == 2 and all(len(entry.top_logprobs) == 2 for entry in logprobs)
    assert [e["custom_id"] for e in errors] == ["long"] and "context" in errors[0]["error"]["message"]
    assert all(r["kind"] == "response" for r in rows.values())

    # the Parquet rows have exactly a chat batch's columns
    chat = [
        {
            "custom_id": "c",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        }
    ]
    chat_table, _, _ = run_batch(tmp_path, redis_url, tiny_model, chat)
    assert table.schema.equals(chat_table.schema)


def test_miro_run_writes_responses_lines_as_response_objects(tmp_path, tiny_model):
    dataset = tmp_path / "d.jsonl"
    dataset.write_text(
        "".join(
            json.dumps(x) + "\n"
            for x in [
                line("a", max_output_tokens=3, metadata={"n": "1"}),
                line("b", max_output_tokens=3, instructions="Hi."),
            ]
        )
    )
    out = tmp_path / "r.jsonl"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from miro.cli.main import cli; cli()",
            "run",
            str(dataset),
            "-o",
            str(out),
            "--model",
            tiny_model,
            "--kv-cache-memory",
            "8MiB",
            "--format",
            "jsonl",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    got = {
        x["custom_id"]: Response.model_validate(x["response"]["body"])
        for x in map(json.loads, out.read_text().splitlines())
    }
    assert (got["a"].metadata, got["a"].instructions, got["b"].instructions) == ({"n": "1"}, None, "Hi.")
    assert all(r.usage.output_tokens <= 3 and r.output[0].role == "assistant" for r in got.values())
