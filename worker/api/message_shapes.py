"""Anthropic's Message Batches objects, as the anthropic SDK reads them (anthropic.types.messages.MessageBatch,
MessageBatchIndividualResponse), and how a Message Batch maps onto a miro batch of chat requests:

- each request `{custom_id, params}` becomes an OpenAI Batch chat line: `system` (a string or text blocks) the
  system message, `messages` with text content (a string or text blocks), `max_tokens`, `temperature`, `top_p`,
  `top_k`, `stop_sequences` as `stop`; parameters miro cannot honour (tools, thinking, images, ...) refuse the
  request in one sentence, and fields that change nothing (metadata, service_tier) are ignored;
- a finished request's row becomes a `succeeded` result with a Message (its text, stop_reason end_turn or
  max_tokens, usage with the prompt tokens the prefix cache served as cache_read_input_tokens), a failed one an
  `errored` result, one an expired batch never ran `expired`, one a cancelled batch never ran `canceled`.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, Field

from miro.worker.fleet.records.batches import BatchRecord

IGNORED_PARAMS = frozenset({"metadata", "service_tier", "stream"})
SUPPORTED_PARAMS = frozenset(
    {"model", "max_tokens", "messages", "system", "temperature", "top_p", "top_k", "stop_sequences"}
)
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}
ENDED = frozenset({"completed", "failed", "cancelled", "expired"})


class MessageBatchRequest(BaseModel):
    custom_id: str = Field(min_length=1, max_length=64)
    params: dict[str, Any]


class MessageBatchCreate(BaseModel):
    """POST /v1/messages/batches."""

    requests: list[MessageBatchRequest] = Field(min_length=1, max_length=100_000)


class MessageBatchRequestCounts(BaseModel):
    processing: int
    succeeded: int
    errored: int
    canceled: int
    expired: int


class MessageBatch(BaseModel):
    id: str
    type: Literal["message_batch"] = "message_batch"
    processing_status: Literal["in_progress", "canceling", "ended"]
    request_counts: MessageBatchRequestCounts
    ended_at: str | None = None
    created_at: str
    expires_at: str
    archived_at: str | None = None
    cancel_initiated_at: str | None = None
    results_url: str | None = None


class MessageBatchDeleted(BaseModel):
    id: str
    type: Literal["message_batch_deleted"] = "message_batch_deleted"


class MessageBatchPage(BaseModel):
    data: list[MessageBatch]
    has_more: bool
    first_id: str | None
    last_id: str | None


class RequestRefused(ValueError):
    """A request miro cannot run as asked: the sentence says why."""


def _rfc3339(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _text(content: Any, where: str) -> str:
    """A string, or text blocks joined with newlines; other blocks are refused by name."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestRefused(f"{where} must be a string or a list of text blocks.")
    texts = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text" or not isinstance(block.get("text"), str):
            raise RequestRefused(f"{where} holds a {kind or 'malformed'} block; miro takes text blocks only.")
        texts.append(block["text"])
    return "\n".join(texts)


def chat_line(request: MessageBatchRequest) -> dict:
    """The request as an OpenAI Batch chat line (submit validates the rest: roles, sampling ranges, the model)."""
    params = request.params
    unknown = sorted(set(params) - SUPPORTED_PARAMS - IGNORED_PARAMS)
    if unknown:
        raise RequestRefused(
            f"params.{unknown[0]} is not supported by miro, and ignoring it would change the answer: remove it."
        )
    if params.get("stream"):
        raise RequestRefused("params.stream must be false in a batch.")
    for required in ("model", "max_tokens", "messages"):
        if required not in params:
            raise RequestRefused(f"params.{required} is required.")
    if not isinstance(params["messages"], list) or not params["messages"]:
        raise RequestRefused("params.messages must be a non-empty list.")
    messages = []
    if params.get("system") is not None:
        messages.append({"role": "system", "content": _text(params["system"], "params.system")})
    for index, message in enumerate(params["messages"]):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise RequestRefused(f"params.messages[{index}].role must be 'user' or 'assistant'.")
        messages.append(
            {"role": message["role"], "content": _text(message.get("content"), f"params.messages[{index}].content")}
        )
    body = {"model": params["model"], "max_tokens": params["max_tokens"], "messages": messages}
    for name in ("temperature", "top_p", "top_k"):
        if params.get(name) is not None:
            body[name] = params[name]
    if params.get("stop_sequences"):
        body["stop"] = params["stop_sequences"]
    return {"custom_id": request.custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def processing_status(status: str) -> str:
    if status in ENDED:
        return "ended"
    return "canceling" if status == "cancelling" else "in_progress"


def message_batch(record: BatchRecord, results_url: str) -> MessageBatch:
    """Anthropic's MessageBatch from miro's record; `results_url` is given once it has ended."""
    shown = processing_status(record.status)
    canceled = record.cancelled - record.expired
    return MessageBatch(
        id=record.id,
        processing_status=shown,
        request_counts=MessageBatchRequestCounts(
            processing=record.remaining,
            succeeded=record.completed,
            errored=record.failed,
            canceled=canceled,
            expired=record.expired,
        ),
        ended_at=_rfc3339(record.at(record.status)) if shown == "ended" else None,
        created_at=_rfc3339(record.created_at),
        expires_at=_rfc3339(record.expires_at or record.created_at + 86400),
        cancel_initiated_at=_rfc3339(record.at("cancelling")),
        results_url=results_url if shown == "ended" else None,
    )


def result_line(rows: list[dict]) -> dict:
    """One request's merged rows as a line of the results file."""
    row = rows[0]
    if row["error_code"] == "batch_expired":
        return {"custom_id": row["custom_id"], "result": {"type": "expired"}}
    if row["error_code"] == "batch_cancelled":  # a cancelled batch's request that never ran
        return canceled_line(row["custom_id"])
    if row["error"]:
        error = {"type": "invalid_request_error", "message": row["error"]}
        return {
            "custom_id": row["custom_id"],
            "result": {"type": "errored", "error": {"type": "error", "error": error}},
        }
    prompt, cached = row["prompt_tokens"] or 0, row["cached_tokens"] or 0
    message = {
        "id": f"msg_{row['job_id']}",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": row["output"]}],
        "model": row["model"],
        "stop_reason": STOP_REASONS.get(row["finish_reason"], "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": prompt - cached,
            "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0,
            "output_tokens": row["completion_tokens"] or 0,
        },
    }
    return {"custom_id": row["custom_id"], "result": {"type": "succeeded", "message": message}}


def canceled_line(custom_id: str) -> dict:
    return {"custom_id": custom_id, "result": {"type": "canceled"}}
