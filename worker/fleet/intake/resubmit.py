"""submit(resume=BATCH): the file's requests added to an existing batch, checked against its record (its queue,
model, priority and task), validated in one pass and then read again a chunk at a time for resume.Resumer, which
enqueues again what has no finished or running job."""

from __future__ import annotations

import time
from typing import Iterator

import redis

from miro.core.errors import MiroError
from miro.worker.fleet.records import batches
from miro.worker.fleet.intake import feed, routing
from miro.worker.fleet.intake.invalid_lines import record_invalid
from miro.worker.fleet.intake.refusals import redis_call, refuse_unusable
from miro.worker.fleet.intake.resume import Resumer
from miro.worker.fleet.intake.submit_result import SubmitResult
from miro.worker.fleet.records.payload import Request


def _chunks(requests: Iterator[Request], size: int) -> Iterator[list[Request]]:
    chunk: list[Request] = []
    for request in requests:
        chunk.append(request)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def resubmit(
    conn: redis.Redis,
    batch_id: str,
    queue_name: str | None,
    model: str | None,
    priority: str | None,
    read_file,
    skip_invalid: bool,
    chunk_size: int,
    log,
) -> SubmitResult:
    """Add to an existing batch the requests of the file without a finished or running job (resume.py). The file is
    read twice: once to validate it (nothing is enqueued if a line is invalid), once to resume."""
    batch = redis_call(conn, lambda: batches.get_batch(conn, batch_id))
    if batch.status in ("cancelling", "expiring"):
        raise MiroError(
            f"Batch {batch_id} is {batch.status}; resume it once it is "
            f"{'cancelled' if batch.status == 'cancelling' else 'expired'}."
        )
    batch.queue = routing.upgrade_recorded_queue(conn, batch.id, batch.queue, batch.priority)
    queue = routing.priority_queue(queue_name, batch.priority) if queue_name is not None else None
    for option, value, recorded in (
        ("queue", queue, batch.queue),
        ("model", model, batch.model),
        ("priority", priority, batch.priority),
    ):
        if value is not None and value != recorded:
            raise MiroError(f"Batch {batch_id} uses {option} '{recorded}', not '{value}'; leave --{option} out.")
    read, requests = read_file()
    for _ in requests:
        pass
    refuse_unusable(read, skip_invalid)
    scan = read.scan
    if scan.task != batch.task:
        raise MiroError(
            f"Batch {batch_id} {'embeds' if batch.task == 'embed' else 'generates'}, but the lines of "
            f"this file {'embed' if scan.task == 'embed' else 'generate'}; resume it with the same --task."
        )
    log(f"Validated {scan.lines:,} lines in {read.validate_s:.2f} s: {scan.valid:,} valid, {scan.invalid:,} invalid.")
    result = SubmitResult.of_read(
        read, batch_id=batch_id, queue=batch.queue, priority=batch.priority, resumed=True, stored=batch.spooled
    )
    resumer = Resumer(conn, batch, result)
    started = time.perf_counter()
    try:
        result.recorded_invalid = record_invalid(conn, batch_id, read)
        _, requests = read_file(progress=None, line_errors=None)
        for chunk in _chunks(requests, chunk_size):
            resumer.resume_chunk(chunk)
        result.unfed = feed.reopen(conn, batch)
        result.enqueue_s = time.perf_counter() - started
        if (result.enqueued or result.unfed) and batch.expires_at is not None and batch.expires_at <= time.time():
            batches.renew_window(conn, batch)  # resumed past its window (expired, say): it starts again from now
        if result.enqueued or result.unfed or batch.status == "validating":
            batches.set_status(conn, batch_id, "in_progress")
            batches.persist(conn, batch_id)  # it runs again: its keys no longer expire with its end
        while (fed := feed.feed(conn, batch_id)) > 0:
            result.enqueued += fed
    except redis.RedisError as e:
        done = f"{result.enqueued:,} requests" if result.enqueued else "no requests"
        raise MiroError(
            f"Redis failed after {done} of batch {batch_id} were enqueued ({str(e).rstrip('.')}); run "
            f"the same command with --resume {batch_id} to enqueue the rest."
        ) from None
    return result
