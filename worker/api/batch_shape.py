"""A miro batch as OpenAI's Batch object: miro's record (status, counters, token sums, `{status}_at` stamps) with what
batch_records.py keeps beside it; and, once a run of the batch has ended, its output and error files (OpenAI
Batch output lines, results.openai_lines) written to the file store, once per run. Until they are written the
batch shows as finalizing (cancelling for a cancelled one), as OpenAI's does while it prepares its results.

Who writes them: `miro serve`'s background loop (background.py) as soon as the batch ends, and failing that the
first request that looks at the batch; one claim per run makes it once."""

from __future__ import annotations

import json
import logging
import time

import redis

from miro.core import defaults
from miro.worker.fleet.output import results
from miro.worker.fleet.records.batches import BatchRecord

from miro.worker.api import batch_records
from miro.worker.api.batch_records import ApiBatch
from miro.worker.api.file_store import FileStore, FileWriter
from miro.worker.api.shapes import (
    Batch,
    BatchErrors,
    BatchUsage,
    InputTokensDetails,
    OutputTokensDetails,
    RequestCounts,
)

log = logging.getLogger("miro.serve")

WAIT_FOR_WRITER_S = 5.0  # how long a retrieve waits for the files another writer is writing, to answer with them
STAMPED = ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")
ENDED = ("completed", "cancelled", "expired")  # runs whose results become files


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _run_end(record: BatchRecord) -> str | None:
    """The stamp of the end of the batch's last run, if it has ended in a way that makes result files."""
    ended = record.at(record.status) if record.status in ENDED else None
    return None if ended is None else f"{ended:.3f}"


def usage(record: BatchRecord) -> BatchUsage:
    """OpenAI's usage from the record's token sums (counted once per custom id with the requests)."""
    return BatchUsage(
        input_tokens=record.prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=record.cached_tokens),
        output_tokens=record.completion_tokens,
        output_tokens_details=OutputTokensDetails(),
        total_tokens=record.prompt_tokens + record.completion_tokens,
    )


def batch_object(record: BatchRecord, api: ApiBatch) -> Batch:
    """OpenAI's Batch from miro's batch record (batches.get_batch) and the API's own fields."""
    status = record.status
    stamps = {f"{stamped}_at": _int(record.at(stamped)) for stamped in STAMPED}
    if status == "expiring":  # OpenAI's Batch has no such status: the batch is stopping to prepare its results
        status, stamps["finalizing_at"] = "finalizing", _int(record.at("expiring"))
    run_end = _run_end(record)
    if run_end is not None and api.files_for != run_end:
        # the run has ended but its files are not written yet: a client that waits for "completed" and then
        # reads output_file_id must not see it before it exists
        stamps[f"{status}_at"] = None
        status = "cancelling" if status == "cancelled" else "finalizing"
    return Batch(
        id=record.id,
        endpoint=api.endpoint,
        input_file_id=api.input_file_id,
        completion_window=api.completion_window,
        status=status,
        errors=BatchErrors(data=api.errors) if api.errors else None,
        output_file_id=api.output_file_id,
        error_file_id=api.error_file_id,
        created_at=int(record.created_at),
        expires_at=_int(record.expires_at),
        **stamps,
        # requests an expired batch never ran are in its error file, so OpenAI counts them failed
        request_counts=RequestCounts(
            total=record.total, completed=record.completed, failed=record.failed + record.expired, reused=api.reused
        ),
        usage=usage(record),
        model=record.model or None,
        metadata=api.metadata,
        reuse_batch_id=api.reuse_batch_id,
    )


def with_result_files(
    conn: redis.Redis, store: FileStore, record: BatchRecord, api: ApiBatch, wait_s: float = 0.0
) -> ApiBatch:
    """`api` with the output and error files of the batch's last run, written now if it has just ended.

    Concurrent callers race for one claim per run; the others wait up to `wait_s` for the winner's files, then
    answer without them, and batch_object shows the batch as still finalizing (or cancelling) until they exist. A batch made without the API whose part files
    the server cannot read gets no files (its results stay where its workers wrote them).
    """
    run_end = _run_end(record)
    if run_end is None or api.files_for == run_end:
        return api
    if not batch_records.claim_files(conn, record.id, run_end):
        return _written_by_another(conn, record, run_end, wait_s) or api
    try:
        output_id, error_id = _write_files(store, conn, record.id, api.output_expires_after_s)
    except OSError as err:
        if api.input_file_id:  # the server's own batch: its storage failed, and the next request tries again
            batch_records.release_claim(conn, record.id, run_end)
            raise
        log.warning(
            "batch %s: its part files at %s cannot be read here (%s); it gets no output file",
            record.id,
            record.output,
            err,
        )
        output_id = error_id = None
    except BaseException:
        batch_records.release_claim(conn, record.id, run_end)
        raise
    batch_records.set_files(conn, record.id, run_end, output_id, error_id)
    return batch_records.of(conn, record)


def _written_by_another(conn: redis.Redis, record: BatchRecord, run_end: str, wait_s: float) -> ApiBatch | None:
    """The batch's API record once another writer has set the run's files, if it does within `wait_s`."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(0.05)
        api = batch_records.of(conn, record)
        if api.files_for == run_end:
            return api
    return None


def _write_files(
    store: FileStore, conn: redis.Redis, batch_id: str, expires_after_s: int | None
) -> tuple[str | None, str | None]:
    """(output file id, error file id); None for a file that would be empty, as OpenAI leaves it. Written a slice of
    lines at a time (results.BatchResults): the server holds a slice, not the batch."""
    writers: dict[bool, tuple[str, FileWriter]] = {}
    try:
        encoded: dict[bool, list[bytes]] = {False: [], True: []}

        def flush() -> None:
            for failed, lines in encoded.items():
                if lines:
                    if failed not in writers:
                        writers[failed] = store.new_writer()
                    writers[failed][1].write(b"".join(lines))
                    lines.clear()

        for table in results.BatchResults(conn, batch_id, divisor=defaults.RESULTS_SERVER_SLICE_DIVISOR).slices():
            for n, line in enumerate(results.openai_lines(table), 1):
                encoded[bool(line["error"])].append(json.dumps(line, ensure_ascii=False).encode() + b"\n")
                if n % results.PYLIST_ROWS == 0:
                    flush()
            flush()
    except BaseException:
        for _, writer in writers.values():
            writer.abort()
        raise

    def file_of(failed: bool, name: str) -> str | None:
        if failed not in writers:
            return None
        file_id, writer = writers[failed]
        writer.commit()
        return store.add(file_id, writer.size, f"{batch_id}_{name}.jsonl", "batch_output", expires_after_s).id

    return file_of(False, "output"), file_of(True, "error")
