"""/v1/messages/batches: Anthropic's Message Batches API over the same submit, workers and records as the OpenAI
Batch API (message_shapes.py says how the two map): create, retrieve, list, cancel, delete and the results JSONL.
A Message Batch is a miro batch of chat requests, its id miro's, so `miro status`, `watch`, `cancel` and `results`
work on it; `miro:message-batches` indexes the ones made here, newest first. Errors are Anthropic's shape
(app.py)."""

from __future__ import annotations

import json
import tempfile
from typing import Iterator

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from miro.core import defaults
from miro.core.errors import MiroError
from miro.worker.fleet.records import batches, keys
from miro.worker.fleet.lifecycle import control
from miro.worker.fleet.output import results
from miro.worker.fleet.intake.refusals import InvalidDataset
from miro.worker.fleet.intake.submit import submit

from miro.worker.api.errors import ApiError, bad_request, not_found
from miro.worker.api.message_shapes import (
    MessageBatch,
    MessageBatchCreate,
    MessageBatchDeleted,
    MessageBatchPage,
    RequestRefused,
    chat_line,
    message_batch,
    processing_status,
    result_line,
)
from miro.worker.api.state import ServerState

router = APIRouter()
NAME = "message batch"  # the name miro status shows for a Message Batch


def _results_url(request: Request, batch_id: str) -> str:
    return str(request.url_for("message_batch_results", batch_id=batch_id))


def _record(state: ServerState, batch_id: str) -> batches.BatchRecord:
    if state.conn.zscore(keys.message_batches(), batch_id) is None:
        raise not_found("message batch", batch_id)
    try:
        return batches.get_batch(state.conn, batch_id)
    except MiroError:
        raise not_found("message batch", batch_id) from None


def _request_of(message: str) -> str:
    """submit's "line N: ..." as the request it was: "requests[N-1]: ..."."""
    head, _, rest = message.partition(": ")
    number = head.removeprefix("line ")
    return f"requests[{int(number) - 1}]: {rest}" if number.isdigit() else message


@router.post("/v1/messages/batches")
async def create_message_batch(body: MessageBatchCreate, request: Request) -> MessageBatch:
    """Made on one of the server's creation threads (slow.py), as /v1/batches is."""
    state = request.app.state.miro
    record = await state.work.create(_create, state, body)
    return message_batch(record, _results_url(request, record.id))


def _create(state: ServerState, body: MessageBatchCreate) -> batches.BatchRecord:
    lines = []
    for index, item in enumerate(body.requests):
        try:
            lines.append(chat_line(item))
        except RequestRefused as why:
            raise bad_request(f"requests[{index}]: {why}", param=f"requests[{index}]") from None
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", encoding="utf-8") as file:
        file.writelines(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
        file.flush()
        try:
            submitted = submit(
                state.conn, file.name, name=NAME, output=state.store.batch_output, endpoint="/v1/chat/completions"
            )
        except InvalidDataset as invalid:
            first = invalid.errors[0]
            more = f" ({len(invalid.errors) - 1:,} more requests are invalid)" if len(invalid.errors) > 1 else ""
            raise bad_request(_request_of(first.message).rstrip(".") + f"{more}.") from None
        except MiroError as err:
            raise bad_request(str(err)) from None
    record = batches.get_batch(state.conn, submitted.batch_id)
    state.conn.zadd(keys.message_batches(), {record.id: record.created_at})
    return record


@router.get("/v1/messages/batches/{batch_id}")
def retrieve_message_batch(batch_id: str, request: Request) -> MessageBatch:
    return message_batch(_record(request.app.state.miro, batch_id), _results_url(request, batch_id))


@router.get("/v1/messages/batches")
def list_message_batches(
    request: Request, limit: int = Query(20, ge=1, le=1000), after_id: str | None = None, before_id: str | None = None
) -> MessageBatchPage:
    """Newest first; `after_id` pages on to older batches, `before_id` back to newer ones."""
    conn, index = request.app.state.miro.conn, keys.message_batches()
    newest_first = [i.decode() for i in conn.zrevrange(index, 0, -1)]
    if after_id is not None:
        start = newest_first.index(after_id) + 1 if after_id in newest_first else len(newest_first)
        chosen, has_more = newest_first[start : start + limit], len(newest_first) > start + limit
    elif before_id is not None:
        end = newest_first.index(before_id) if before_id in newest_first else 0
        chosen, has_more = newest_first[max(end - limit, 0) : end], end - limit > 0
    else:
        chosen, has_more = newest_first[:limit], len(newest_first) > limit
    found = batches.records(conn, chosen)
    return MessageBatchPage(
        data=[message_batch(r, _results_url(request, r.id)) for r in found],
        has_more=has_more,
        first_id=found[0].id if found else None,
        last_id=found[-1].id if found else None,
    )


@router.post("/v1/messages/batches/{batch_id}/cancel")
def cancel_message_batch(batch_id: str, request: Request) -> MessageBatch:
    state = request.app.state.miro
    record = _record(state, batch_id)
    if processing_status(record.status) == "in_progress":
        try:
            control.cancel(state.conn, batch_id)
        except MiroError as err:  # it ended meanwhile
            raise ApiError(400, str(err)) from None
    return message_batch(batches.get_batch(state.conn, batch_id), _results_url(request, batch_id))


@router.delete("/v1/messages/batches/{batch_id}")
def delete_message_batch(batch_id: str, request: Request) -> MessageBatchDeleted:
    """A batch that has ended leaves the Message Batches API (miro's own record and rows stay)."""
    state = request.app.state.miro
    record = _record(state, batch_id)
    if processing_status(record.status) != "ended":
        raise bad_request(
            f"Message batch {batch_id} is still {processing_status(record.status)}; cancel it, and "
            "delete it once it has ended."
        )
    state.conn.zrem(keys.message_batches(), batch_id)
    return MessageBatchDeleted(id=batch_id)


@router.get("/v1/messages/batches/{batch_id}/results", name="message_batch_results")
def message_batch_results(batch_id: str, request: Request) -> StreamingResponse:
    """One JSON line per request (custom_id, result), once the batch has ended."""
    state = request.app.state.miro
    record = _record(state, batch_id)
    if processing_status(record.status) != "ended":
        raise bad_request(
            f"Message batch {batch_id} is still {processing_status(record.status)}; its results come once it has ended."
        )
    merged = results.BatchResults(
        state.conn, batch_id, cancelled=True, divisor=defaults.RESULTS_SERVER_SLICE_DIVISOR
    )  # read before the response starts
    return StreamingResponse(_result_lines(merged), media_type="application/x-jsonl")


def _result_lines(merged: results.BatchResults) -> Iterator[bytes]:
    """The results file's lines a slice at a time (a request's rows are all in one slice): the requests that never
    ran, an expired or cancelled batch's, each as its line's `expired` or `canceled` result."""
    for table in merged.slices():
        lines = []
        for rows in results.request_rows(table):
            lines.append(json.dumps(result_line(rows), ensure_ascii=False).encode() + b"\n")
            if len(lines) == results.PYLIST_ROWS:
                yield b"".join(lines)
                lines = []
        if lines:
            yield b"".join(lines)
