"""The Batch API a client expects: batches made by miro-submit listed and retrieved beside the API's own, with usage,
and their result files written without a request once a worker (the tiny model) has run them; a batch the server
expires when its window ends, no worker running; file expiry (expires_after, output_expires_after) and
x-request-id. Every object is checked with the SDK's own types."""

from __future__ import annotations

import json
import time

import openai
import pytest
import redis
from openai.types import Batch, FileObject
from openai.types.chat import ChatCompletion
from polling import wait_for
from rq.serializers import JSONSerializer
from serve_process import chat_line, jsonl

from miro.worker import BatchWorker
from miro.worker.fleet.records import batches, keys
from miro.worker.fleet.intake.routing import queue_for
from miro.worker.fleet.intake.submit import submit


def upload(client, lines: list[dict], **kwargs) -> FileObject:
    return client.files.create(file=("d.jsonl", jsonl(lines)), purpose="batch", **kwargs)


def raw(client, path: str) -> dict:
    """The server's JSON as it sent it (the SDK's models do not validate what they are given)."""
    return client.get(path, cast_to=object)


def test_batches_made_by_miro_submit_are_listed_and_retrieved_as_sdk_batches(serve, redis_url, tmp_path):
    server = serve(redis_url)
    client = server.client()
    conn = redis.Redis.from_url(redis_url)
    made_by_api = client.batches.create(
        input_file_id=upload(client, [chat_line(0)]).id, endpoint="/v1/chat/completions", completion_window="24h"
    ).id
    dataset = tmp_path / "simple.jsonl"
    dataset.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"Say {i}."}) + "\n" for i in range(3)))
    made_by_cli = submit(conn, dataset, output=str(tmp_path / "out"), completion_window="2h").batch_id
    batches.count_finished(conn, made_by_cli, "q0", prompt_tokens=7, cached_tokens=4, completion_tokens=5)

    listed = raw(client, "/batches")
    assert [b["id"] for b in listed["data"]] == [made_by_cli, made_by_api]  # newest first, whatever made them
    for shown in listed["data"]:
        Batch.model_validate(shown)
    cli_batch = Batch.model_validate(raw(client, f"/batches/{made_by_cli}"))
    record = batches.get_batch(conn, made_by_cli)
    assert (cli_batch.status, cli_batch.endpoint, cli_batch.input_file_id) == ("in_progress", "/v1/completions", "")
    assert (cli_batch.completion_window, cli_batch.expires_at) == ("2h", int(record.created_at) + 7200)
    assert cli_batch.metadata == {"name": "simple.jsonl"} and cli_batch.model == "smollm2-135m"
    assert (cli_batch.request_counts.total, cli_batch.request_counts.completed) == (3, 1)
    usage = cli_batch.usage
    assert (
        usage.input_tokens,
        usage.input_tokens_details.cached_tokens,
        usage.output_tokens,
        usage.output_tokens_details.reasoning_tokens,
        usage.total_tokens,
    ) == (7, 4, 5, 0, 12)
    assert [b.id for b in client.batches.list(limit=1)] == [made_by_cli, made_by_api]  # pages of one

    cancelled = client.batches.cancel(made_by_cli)  # a CLI batch is cancelled as any: its queued jobs go
    assert cancelled.status in ("cancelling", "cancelled")
    ended = wait_for(lambda: (b := client.batches.retrieve(made_by_cli)).status == "cancelled" and b, timeout_s=10)
    assert ended and ended.cancelled_at is not None and ended.output_file_id is None  # no row was written


def test_a_miro_submit_batch_that_completes_gets_its_result_files_with_no_request(
    serve, redis_url, tmp_path, tiny_model
):
    client = serve(redis_url).client()
    conn = redis.Redis.from_url(redis_url)
    dataset = tmp_path / "chat.jsonl"
    lines = [chat_line(i) for i in range(3)]
    lines[2]["body"]["messages"][0]["content"] = "hello " * 200  # over the tiny model's context: it fails
    dataset.write_text("".join(json.dumps(line) + "\n" for line in lines))
    batch_id = submit(conn, dataset, output=str(tmp_path / "out"), model=tiny_model).batch_id
    BatchWorker(
        [queue_for(tiny_model)],
        connection=conn,
        serializer=JSONSerializer,
        model=tiny_model,
        engine_options={"kv_cache_memory": "4MiB"},
    ).work(burst=True)
    assert wait_for(lambda: conn.hget(keys.api_batch(batch_id), "files_for"), timeout_s=10, every_s=0.1)
    done = Batch.model_validate(raw(client, f"/batches/{batch_id}"))
    assert (done.status, done.endpoint, done.request_counts.completed, done.request_counts.failed) == (
        "completed",
        "/v1/chat/completions",
        2,
        1,
    )
    assert done.usage.output_tokens > 0 and done.completed_at is not None
    output = [json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()]
    assert [line["custom_id"] for line in output] == ["r0", "r1"]
    assert all(ChatCompletion.model_validate(line["response"]["body"]).choices for line in output)
    (failed,) = [json.loads(line) for line in client.files.content(done.error_file_id).text.splitlines()]
    assert failed["custom_id"] == "r2" and failed["error"]["code"] == "request_failed"


def test_a_batch_past_its_window_is_expired_by_the_server_with_batch_expired_errors(serve, redis_url):
    client = serve(redis_url).client()
    conn = redis.Redis.from_url(redis_url)
    lines = [chat_line(i) for i in range(4)]
    batch = client.batches.create(
        input_file_id=upload(client, lines).id,
        endpoint="/v1/chat/completions",
        completion_window="2s",
        output_expires_after={"anchor": "created_at", "seconds": 7200},
    )
    assert batch.status == "in_progress" and batch.expires_at == batch.created_at + 2
    # no worker runs: the server's background loop expires it, and writes its files, with nobody asking
    assert wait_for(lambda: batches.get_batch(conn, batch.id).status == "expired", timeout_s=10, every_s=0.1)
    assert wait_for(lambda: conn.hget(keys.api_batch(batch.id), "files_for"), timeout_s=10, every_s=0.1)
    shown = raw(client, f"/batches/{batch.id}")
    expired = Batch.model_validate(shown)
    assert expired.status == "expired" and expired.expired_at >= expired.expires_at
    assert (expired.request_counts.total, expired.request_counts.completed, expired.request_counts.failed) == (4, 0, 4)
    assert expired.output_file_id is None and expired.usage.total_tokens == 0
    errors = [json.loads(line) for line in client.files.content(expired.error_file_id).text.splitlines()]
    assert sorted(e["custom_id"] for e in errors) == ["r0", "r1", "r2", "r3"]
    assert all(e["response"] is None and e["error"]["code"] == "batch_expired" for e in errors)
    error_file = FileObject.model_validate(raw(client, f"/files/{expired.error_file_id}"))
    assert error_file.purpose == "batch_output" and error_file.expires_at == error_file.created_at + 7200
    with pytest.raises(openai.BadRequestError) as err:
        client.batches.cancel(batch.id)
    assert err.value.body["message"] == f"Batch {batch.id} is expired; there is nothing left to cancel."


def test_files_expire_and_their_bytes_are_deleted(serve, redis_url):
    server = serve(redis_url)
    client = server.client()
    conn = redis.Redis.from_url(redis_url)
    kept = upload(client, [chat_line(0)])
    assert kept.expires_at is None
    hour = upload(client, [chat_line(0)], expires_after={"anchor": "created_at", "seconds": 3600})
    assert FileObject.model_validate(raw(client, f"/files/{hour.id}")).expires_at == hour.created_at + 3600
    for policy, param, sentence in (
        (
            {"anchor": "created_at", "seconds": 60},
            "expires_after.seconds",
            "expires_after.seconds must be a whole number of seconds from 3,600 (1 hour) to 2,592,000 (30 days), "
            "not '60'.",
        ),
        (
            {"anchor": "last_active_at", "seconds": 3600},
            "expires_after.anchor",
            "expires_after.anchor must be 'created_at', not 'last_active_at'.",
        ),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            upload(client, [chat_line(0)], expires_after=policy)
        assert (err.value.body["param"], err.value.body["message"]) == (param, sentence)
    with pytest.raises(openai.BadRequestError) as err:
        client.batches.create(
            input_file_id=kept.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            output_expires_after={"anchor": "created_at", "seconds": 2592001},
        )
    assert err.value.body["param"] == "output_expires_after.seconds"
    assert sorted(p.name for p in (server.storage / "files").iterdir()) == sorted([kept.id, hour.id])  # refused: gone

    def age(file_id: str) -> None:  # as if its hour had passed
        conn.hset(keys.file(file_id), "expires_at", int(time.time()) - 1)
        conn.zadd(keys.file_deadlines(), {file_id: time.time() - 1})

    age(hour.id)
    with pytest.raises(openai.NotFoundError) as err:  # whoever next touches it finds it gone
        client.files.retrieve(hour.id)
    assert err.value.body["code"] == "not_found" and not (server.storage / "files" / hour.id).exists()
    later = upload(client, [chat_line(0)], expires_after={"anchor": "created_at", "seconds": 3600})
    age(later.id)
    assert wait_for(lambda: not (server.storage / "files" / later.id).exists(), timeout_s=10, every_s=0.1)
    assert not conn.exists(keys.file(later.id))  # the background loop deleted it, record and bytes
    assert [f.id for f in client.files.list()] == [kept.id]


def test_every_response_names_its_request(serve, redis_url):
    client = serve(redis_url).client()
    answered = client.files.with_raw_response.list()
    first = answered.headers["x-request-id"]
    assert first.startswith("req_") and len(first) == 36
    assert client.batches.with_raw_response.list().headers["x-request-id"] != first
    with pytest.raises(openai.NotFoundError) as err:
        client.batches.retrieve("batch_0123")
    assert err.value.request_id.startswith("req_") and err.value.body["request_id"] == err.value.request_id
