"""Batches over HTTP with the openai SDK, no worker needed: creation through miro's submit, refusals, failed
validation with line errors, pagination, priority, 404s and a Redis that goes away under the server."""

from __future__ import annotations

import json

import openai
import pytest
import redis
from serve_process import chat_line, jsonl

from miro.worker.fleet.records import batches
from miro.worker.api import batch_records


def upload(client, lines: list[dict] | bytes, name: str = "d.jsonl") -> str:
    data = lines if isinstance(lines, bytes) else jsonl(lines)
    return client.files.create(file=(name, data), purpose="batch").id


def create(client, file_id: str, endpoint: str = "/v1/chat/completions", **kwargs):
    return client.batches.create(input_file_id=file_id, endpoint=endpoint, completion_window="24h", **kwargs)


def test_a_batch_is_miros_own_with_openais_shape(serve, redis_url):
    client = serve(redis_url).client()
    file_id = upload(client, [chat_line(i) for i in range(3)])
    batch = create(client, file_id, metadata={"project": "x"})
    assert batch.id.startswith("batch_") and batch.status == "in_progress" and batch.input_file_id == file_id
    assert (batch.endpoint, batch.completion_window, batch.metadata) == (
        "/v1/chat/completions",
        "24h",
        {"project": "x"},
    )
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (3, 0, 0)
    assert batch.created_at <= batch.in_progress_at and batch.expires_at == batch.created_at + 24 * 3600
    assert batch.errors is None and batch.output_file_id is None and batch.model == "smollm2-135m"
    record = batches.get_batch(redis.Redis.from_url(redis_url), batch.id)  # miro status, cancel, ... see it
    assert (record.status, record.total, record.name, record.priority) == ("in_progress", 3, "d.jsonl", "normal")
    assert client.batches.retrieve(batch.id) == batch


def test_metadata_priority_is_the_batchs_priority(serve, redis_url):
    client = serve(redis_url).client()
    file_id = upload(client, [chat_line(0)])
    batch = create(client, file_id, metadata={"priority": "high"})
    record = batches.get_batch(redis.Redis.from_url(redis_url), batch.id)
    assert record.priority == "high" and batch.metadata == {"priority": "high"}
    with pytest.raises(openai.BadRequestError) as err:
        create(client, file_id, metadata={"priority": "urgent"})
    assert err.value.body["param"] == "metadata.priority"


def test_an_invalid_file_gives_a_failed_batch_naming_its_lines(serve, redis_url):
    client = serve(redis_url).client()
    good = json.dumps(chat_line(0))
    data = (
        "\n".join(
            [
                good,
                '{"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {',  # not JSON
                json.dumps(chat_line(0)),  # custom id r0 again
                json.dumps(
                    {
                        "custom_id": "r3",
                        "method": "POST",
                        "url": "/v1/completions",  # another endpoint
                        "body": {"model": "smollm2-135m", "prompt": "Say 3.", "max_tokens": 4},
                    }
                ),
                json.dumps({"id": "q4", "prompt": "hello"}),  # a simple line: not the Batch API's
            ]
        ).encode()
        + b"\n"
    )
    batch = create(client, upload(client, data))
    assert batch.status == "failed" and batch.failed_at is not None and batch.in_progress_at is None
    assert batch.request_counts.total == 0 and batch.model is None
    errors = batch.errors.data
    assert [(e.line, e.code) for e in errors] == [
        (2, "invalid_request"),
        (3, "duplicate_custom_id"),
        (4, "url_mismatch"),
        (5, "url_mismatch"),
    ]
    assert all(e.message.startswith(f"line {e.line}: ") for e in errors)
    assert client.batches.retrieve(batch.id).errors == batch.errors
    assert batches.get_batch(redis.Redis.from_url(redis_url), batch.id).status == "failed"

    empty = create(client, upload(client, b"\n"))
    assert empty.status == "failed" and empty.errors.data[0].code == "invalid_file"
    assert "empty" in empty.errors.data[0].message


def test_a_custom_id_over_the_limit_and_a_line_with_no_end_fail_the_batch_in_one_sentence_each(serve, redis_url):
    """Issue 37: a custom id is at most MAX_CUSTOM_ID characters, and a line over the limit with no newline (20 MB
    here) is refused by its size, never read whole."""
    from miro.worker.fleet.intake.inputs import MAX_CUSTOM_ID

    client = serve(redis_url).client()
    long_id = {**chat_line(1), "custom_id": "k" * (MAX_CUSTOM_ID + 1)}
    batch = create(client, upload(client, [chat_line(0), long_id]))
    assert batch.status == "failed"
    assert [(e.line, e.code, e.message) for e in batch.errors.data] == [
        (
            2,
            "invalid_request",
            f"line 2: field 'custom_id': a custom id of {MAX_CUSTOM_ID + 1:,} characters is too "
            f"long (at most {MAX_CUSTOM_ID:,}).",
        )
    ]
    no_end = json.dumps(chat_line(0)).encode() + b"\n" + b'{"custom_id": "' + b"y" * (20 << 20)
    batch = create(client, upload(client, no_end))
    assert [(e.line, e.message) for e in batch.errors.data] == [
        (
            2,
            f"line 2: the line is {len(no_end) - len(json.dumps(chat_line(0))) - 1:,} bytes, over the limit of "
            "1,000,000 bytes.",
        )
    ]


def test_refusals_at_creation_are_openai_errors(serve, redis_url):
    client = serve(redis_url).client()
    file_id = upload(client, [chat_line(0)])
    with pytest.raises(openai.NotFoundError):
        create(client, "file-0123")
    with pytest.raises(openai.BadRequestError) as err:
        create(client, file_id, endpoint="/v1/moderations")
    assert err.value.body["param"] == "endpoint"
    assert err.value.body["message"] == (
        "miro runs batches for the endpoints /v1/chat/completions, /v1/completions, "
        "/v1/responses and /v1/embeddings, not '/v1/moderations'."
    )
    with pytest.raises(openai.BadRequestError) as err:
        client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="soon")
    assert err.value.body["param"] == "completion_window"
    assert err.value.body["message"] == (
        "The completion window 'soon' is not valid: give a duration such as 24h (OpenAI's), 30m, 90s or 2d."
    )
    with pytest.raises(openai.BadRequestError) as err:
        create(client, file_id, metadata={f"k{i}": "v" for i in range(17)})
    assert err.value.body["param"] == "metadata" and "at most 16" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        client.post("/batches", body={"endpoint": "/v1/completions"}, cast_to=object)
    assert err.value.body["param"] == "input_file_id"
    with pytest.raises(openai.NotFoundError) as err:
        client.batches.retrieve("batch_0123")
    assert err.value.body["code"] == "not_found"
    with pytest.raises(openai.NotFoundError):
        client.batches.cancel("batch_0123")
    with pytest.raises(openai.NotFoundError):
        client.get("/nowhere", cast_to=object)
    assert list(client.batches.list()) == []


def test_batches_list_pages_newest_first(serve, redis_url):
    client = serve(redis_url).client()
    file_id = upload(client, [chat_line(0)])
    made = [create(client, file_id).id for _ in range(5)]
    newest_first = made[::-1]
    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == newest_first[:2] and page.has_more
    seen, after = [], None
    while True:
        page = client.batches.list(limit=2, **({"after": after} if after else {}))
        seen += [b.id for b in page.data]
        if not page.has_more:
            break
        after = page.data[-1].id
    assert seen == newest_first
    assert [b.id for b in client.batches.list(limit=2)] == newest_first  # the SDK follows the pages itself
    last = client.batches.list(after=newest_first[-1])
    assert last.data == [] and not last.has_more
    raw = client.get("/batches", cast_to=object, options={"params": {"limit": 3}})
    assert (raw["first_id"], raw["last_id"], raw["has_more"]) == (newest_first[0], newest_first[2], True)


def test_a_redis_that_goes_away_is_a_503_in_openais_shape(serve, own_redis):
    url, redis_process = own_redis
    client = serve(url).client()
    file_id = upload(client, [chat_line(0)])
    redis_process.kill()
    redis_process.wait()
    for call in (
        client.files.list,
        lambda: client.files.retrieve(file_id),
        client.batches.list,
        lambda: create(client, file_id),
        lambda: client.get("/workers", cast_to=object),
    ):
        with pytest.raises(openai.InternalServerError) as err:
            call()
        assert err.value.status_code == 503
        assert set(err.value.body) == {"message", "type", "param", "code", "request_id"}
        assert err.value.request_id == err.value.body["request_id"] and err.value.request_id.startswith("req_")
        assert err.value.body["code"] == "redis_unavailable" and url in err.value.body["message"]


def test_an_ended_batch_shows_finalizing_until_its_result_files_are_written(serve, redis_url):
    client = serve(redis_url).client()
    batch = create(client, upload(client, [chat_line(0)]))
    conn = redis.Redis.from_url(redis_url)
    batches.set_status(conn, batch.id, "completed")  # as the worker that counts the last request does
    completed_at = batches.get_batch(conn, batch.id).at("completed")
    run_end = f"{completed_at:.3f}"
    assert batch_records.claim_files(conn, batch.id, run_end)  # as another request writing the files would
    shown = client.batches.retrieve(batch.id)
    assert (shown.status, shown.completed_at, shown.output_file_id) == ("finalizing", None, None)
    batch_records.release_claim(conn, batch.id, run_end)  # that request failed: the next one writes them
    shown = client.batches.retrieve(batch.id)
    assert (shown.status, shown.completed_at) == ("completed", int(completed_at))
