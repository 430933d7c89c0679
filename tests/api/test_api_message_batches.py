"""Anthropic's Message Batches API on `miro serve`, through the unmodified anthropic SDK: a batch runs on a real
BatchWorker (the tiny model serving the name the requests ask for), its results come back succeeded and errored,
a cancelled batch's requests canceled, an expired one's expired; list pages, refusals are Anthropic's errors, and
every object validates as the SDK's own type."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
import redis
from polling import wait_for
from rq.serializers import JSONSerializer

anthropic = pytest.importorskip("anthropic")
from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse  # noqa: E402

from miro.worker import BatchWorker  # noqa: E402
from miro.worker.fleet.records import batches, keys  # noqa: E402
from miro.worker.fleet.intake.routing import queue_for  # noqa: E402


def client_of(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


def request(custom_id: str, text: str = "Say hi.", **params) -> dict:
    return {
        "custom_id": custom_id,
        "params": {"model": "smollm2-135m", "max_tokens": 3, "messages": [{"role": "user", "content": text}], **params},
    }


def raw_batch(client, batch_id: str) -> MessageBatch:
    return MessageBatch.model_validate(client.get(f"/v1/messages/batches/{batch_id}", cast_to=object))


def raw_results(url: str) -> list[MessageBatchIndividualResponse]:
    with urllib.request.urlopen(url, timeout=60) as response:
        return [MessageBatchIndividualResponse.model_validate(json.loads(line)) for line in response]


def test_a_message_batch_runs_and_its_results_are_anthropics(serve, redis_url, tiny_model):
    server = serve(redis_url)
    client = client_of(server)
    requests = [
        request("plain"),
        request(
            "blocks",
            system=[{"type": "text", "text": "Be brief."}],
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]}
            ],
            temperature=0.0,
            top_k=5,
            stop_sequences=["\n\n"],
            metadata={"user_id": "u1"},
        ),
        request("long", text="hello " * 200),  # over the tiny model's context: errored
    ]
    created = client.messages.batches.create(requests=requests)
    shown = raw_batch(client, created.id)
    assert shown.processing_status == "in_progress" and shown.results_url is None
    assert shown.request_counts.processing == 3 and shown.expires_at > shown.created_at
    assert batches.get_batch(redis.Redis.from_url(redis_url), created.id).total == 3  # miro's own batch

    BatchWorker(
        [queue_for("smollm2-135m")],
        connection=redis.Redis.from_url(redis_url),
        serializer=JSONSerializer,
        model=tiny_model,
        served_model_names=["smollm2-135m"],
        engine_options={"kv_cache_memory": "4MiB"},
    ).work(burst=True)
    ended = raw_batch(client, created.id)
    counts = ended.request_counts
    assert ended.processing_status == "ended" and ended.ended_at is not None and ended.results_url
    assert (counts.processing, counts.succeeded, counts.errored, counts.canceled, counts.expired) == (0, 2, 1, 0, 0)
    got = {line.custom_id: line.result for line in client.messages.batches.results(created.id)}
    assert {cid: r.type for cid, r in got.items()} == {"plain": "succeeded", "blocks": "succeeded", "long": "errored"}
    for cid in ("plain", "blocks"):
        message = got[cid].message
        assert message.role == "assistant" and message.content[0].type == "text"
        assert message.stop_reason in ("end_turn", "max_tokens") and message.usage.output_tokens <= 3
        assert message.usage.input_tokens + message.usage.cache_read_input_tokens > 0
    assert got["long"].error.error.type == "invalid_request_error" and "context" in got["long"].error.error.message
    assert len(raw_results(ended.results_url)) == 3  # each line validates as the SDK's type

    second = client.messages.batches.create(requests=[request("a"), request("b")])
    page = client.messages.batches.list(limit=1)
    assert [b.id for b in page.data] == [second.id] and page.has_more
    assert [b.id for b in client.messages.batches.list(limit=1)] == [second.id, created.id]  # the SDK pages
    assert [b.id for b in client.messages.batches.list(before_id=created.id).data] == [second.id]

    canceling = client.messages.batches.cancel(second.id)
    assert canceling.processing_status in ("canceling", "ended") and canceling.cancel_initiated_at is not None
    assert wait_for(lambda: raw_batch(client, second.id).processing_status == "ended", timeout_s=10)
    assert raw_batch(client, second.id).request_counts.canceled == 2
    assert sorted((r.custom_id, r.result.type) for r in client.messages.batches.results(second.id)) == [
        ("a", "canceled"),
        ("b", "canceled"),
    ]
    deleted = client.messages.batches.delete(second.id)
    assert (deleted.id, deleted.type) == (second.id, "message_batch_deleted")
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(second.id)


def test_an_expired_message_batchs_requests_are_expired(serve, redis_url):
    server = serve(redis_url)
    client = client_of(server)
    conn = redis.Redis.from_url(redis_url)
    created = client.messages.batches.create(requests=[request("x"), request("y")])
    # as if its 24 hours had passed, no worker having run it: the server expires it
    past = time.time() - 1
    conn.hset(keys.batch(created.id), "expires_at", f"{past:.3f}")
    conn.zadd(keys.batch_deadlines(), {created.id: past})
    assert wait_for(lambda: raw_batch(client, created.id).processing_status == "ended", timeout_s=10, every_s=0.1)
    assert raw_batch(client, created.id).request_counts.expired == 2
    assert sorted((r.custom_id, r.result.type) for r in client.messages.batches.results(created.id)) == [
        ("x", "expired"),
        ("y", "expired"),
    ]


def test_refusals_are_anthropics_errors(serve, redis_url):
    client = client_of(serve(redis_url))
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.batches.create(requests=[request("t", tools=[{"name": "f", "input_schema": {}}])])
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "invalid_request_error"
    assert err.value.body["error"]["message"] == (
        "requests[0]: params.tools is not supported by miro, and ignoring it would change the answer: remove it."
    )
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.batches.create(requests=[request("same"), request("same")])
    assert err.value.body["error"]["message"].startswith("requests[1]: ")
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.batches.create(
            requests=[request("img", messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}])]
        )
    assert "holds a image block; miro takes text blocks only" in err.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.batches.retrieve("batch_0123")
    assert err.value.body["error"]["type"] == "not_found_error" and err.value.request_id.startswith("req_")
    assert list(client.messages.batches.list()) == []
