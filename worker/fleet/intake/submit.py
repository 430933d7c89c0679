"""miro-submit: validate a JSONL dataset in one streaming pass, store its requests, write the batch record and
enqueue the first window of RQ jobs.

Each valid line goes into the batch's stored requests (spool.py) as it is read, so the submitter holds one line and
one chunk at a time; custom ids are remembered in 12 bytes a slot (seen_ids.py, about 18 bytes a line) for big
files, the one thing kept per line (read_pass.py: what the pass gathers). Invalid lines are
reported as they are found (`on_line_error`). Only when the whole file is read and no line is invalid (or
`skip_invalid`: invalid_lines.py) is the batch record written and the first window fed (feed.py); a refused file
(refusals.py) leaves nothing behind. The feeder turns the rest into jobs as the fleet drains the queue. `resume`
(resubmit.py, resume.py) runs again what an existing batch has not finished.
"""

from __future__ import annotations

import os
import time
from contextlib import suppress
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Iterator

import redis

from miro.core import defaults
from miro.core.defaults import PRIORITY as DEFAULT_PRIORITY
from miro.core.errors import MiroError
from miro.worker.fleet.records import batches
from miro.worker.fleet.intake import durations, feed, routing, spool, tables
from miro.worker.fleet.intake.columns import InputColumns
from miro.worker.fleet.intake.reuse import Reuser, ReuseSource
from miro.worker.fleet.output import storage
from miro.worker.fleet.intake.dataset import DatasetScan, scan_dataset
from miro.worker.fleet.intake.inputs import LineError
from miro.worker.fleet.intake.invalid_lines import record_invalid
from miro.worker.fleet.intake.read_pass import Read, seen_ids_for
from miro.worker.fleet.intake.refusals import redis_call, refuse_other_model, refuse_unusable
from miro.worker.fleet.intake.resubmit import resubmit
from miro.worker.fleet.intake.submit_result import SubmitResult
from miro.worker.fleet.records.payload import Request
from miro.worker.fleet.observe.urls import redacted

CHUNK = defaults.SPOOL_CHUNK
JOB_TIMEOUT_S, COMPLETION_WINDOW = (
    defaults.JOB_TIMEOUT_S,
    defaults.COMPLETION_WINDOW,
)  # SubmitOptions' (a field is named defaults)


def output_uri(output: str) -> str:
    """A URI (s3://..., gs://..., file://...) as given; a local path made absolute, so workers agree on it."""
    if storage.is_uri(output):
        return output
    return os.path.abspath(os.path.expanduser(output))


@dataclass(frozen=True)
class SubmitOptions:
    """Every option of a submission in one record (EngineConfig and WorkerConfig are the engine's and the
    worker's): what `miro submit`, `miro run` and `miro serve`'s batches give submit(), by name. See submit()."""

    queue_name: str | None = None
    name: str | None = None
    output: str = defaults.OUTPUT
    model: str | None = None
    defaults: dict | None = None  # SamplingParams options of lines without them
    skip_invalid: bool = False
    dry_run: bool = False
    resume: str | None = None
    job_timeout: int | str | None = JOB_TIMEOUT_S
    chunk_size: int = CHUNK
    priority: str | None = None
    endpoint: str | None = None
    task: str | None = None
    pooling_defaults: dict | None = None
    completion_window: str = COMPLETION_WINDOW
    requests_per_job: int | None = None
    columns: InputColumns | None = None
    input_format: str | None = None
    reuse: ReuseSource | None = None

    @classmethod
    def of(cls, options: dict) -> SubmitOptions:
        """The options named in `options`, the rest their defaults; an unknown name is refused in one sentence."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise MiroError(f"submit has no option {unknown[0]!r} (it takes {', '.join(sorted(names))}).")
        return cls(**options)


def submit(
    conn: redis.Redis | None,
    path: str | Path,
    options: SubmitOptions | None = None,
    *,
    log: Callable[[str], None] | None = None,
    on_line_error: Callable[[LineError], None] | None = None,
    on_progress: Callable[[DatasetScan], None] | None = None,
    **named,
) -> SubmitResult:
    """Validate the dataset at `path`, store its valid requests and enqueue the first window; see the module
    docstring. The options are a SubmitOptions, or its fields by name.

    `conn` may be None for a dry run (which touches no Redis key and stores nothing). `priority` (high, normal or
    low; None is normal) picks the queue (routing.priority_queue) and is recorded in the batch record and in every
    job. With `resume=BATCH` the requests go to that existing batch (its queue, model, priority and output); only
    custom ids without a finished or still running job are enqueued. With `endpoint` (an OpenAI batch's) every
    line must be an OpenAI Batch line with that url (dataset.scan_dataset). `task` ("generate" or "embed"; None:
    the first line's) is what the batch does, `defaults` and `pooling_defaults` the sampling and pooling options of
    lines without them. `completion_window` ("24h", "30m", ...) is how long the batch may run before what has not
    run expires (expiry.py); a resumed batch keeps its own, renewed from now if it has passed. `on_line_error` is
    called with each invalid line as it is found, `on_progress` as the file is read. `input_format` and `columns`:
    a Parquet, CSV or saved HF dataset and which of its columns make a request (dataset.scan_dataset). `reuse`
    (reuse.ReuseSource): the rows of an earlier result whose request is deterministic and identical are this
    batch's rows instead of running again (reuse.py; not with `resume`); given no `model`, the batch runs on
    `reuse.model`, which its lines must name (OtherModel otherwise). Raises InvalidDataset (nothing enqueued) when a
    line is invalid and not `skip_invalid`, MiroError for other problems a user can cause.
    """
    options = options if options is not None else SubmitOptions.of(named)
    (
        queue_name,
        name,
        output,
        model,
        defaults,
        skip_invalid,
        dry_run,
        resume,
        job_timeout,
        chunk_size,
        priority,
        endpoint,
        task,
        pooling_defaults,
        completion_window,
        requests_per_job,
        columns,
        input_format,
        reuse,
    ) = (getattr(options, f.name) for f in fields(SubmitOptions))
    log = log or (lambda message: None)
    timeout = durations.job_timeout(job_timeout)
    durations.completion_window(completion_window)  # a window that is no duration is refused before anything
    if queue_name is not None and not queue_name.strip():
        raise MiroError("The queue name must not be empty.")
    if priority is not None:
        routing.check_priority(priority)
    if resume is not None and not batches.BATCH_ID_RE.fullmatch(resume):
        raise MiroError(f"'{resume}' is not a batch id (they look like batch_ followed by 24 hex digits).")
    if not dry_run and conn is None:
        raise ValueError("submit needs a Redis connection unless dry_run")
    if reuse is not None and ((model is None and reuse.model is None) or resume is not None):
        raise MiroError(
            "--reuse needs --model (the model its rows were made with is compared by its file's sha256), "
            "and does not go with --resume."
        )

    fmt = tables.input_format(path, input_format)

    def read_file(progress=on_progress, line_errors=on_line_error) -> tuple[Read, Iterator[Request]]:
        read = Read(DatasetScan(), seen=seen_ids_for(path, fmt))
        items = scan_dataset(
            path,
            defaults,
            endpoint=endpoint,
            task=task,
            pooling_defaults=pooling_defaults,
            scan=read.scan,
            seen=read.seen,
            on_progress=progress,
            columns=columns,
            input_format=fmt,
        )
        return read, read.take(items, line_errors)

    if resume is not None and not dry_run:
        return resubmit(conn, resume, queue_name, model, priority, read_file, skip_invalid, chunk_size, log)
    read, requests = read_file()
    scan = read.scan

    batch_id = None if dry_run else batches.new_batch_id()
    output = output_uri(output)
    writer = None if dry_run else spool.SpoolWriter(output, batch_id, chunk_size)
    reuser = Reuser(reuse, output, batch_id, model or reuse.model) if reuse is not None and writer is not None else None
    try:
        if writer is not None:
            spool.check_output(output)
        for request in requests:
            if reuser is not None and reuser.take(request):
                continue  # its earlier rows are this batch's: it is not stored, and never runs
            if writer is not None:
                writer.add(request)
        chunks = writer.close() if writer is not None else 0
        if reuser is not None:
            reuser.close()
        refuse_unusable(read, skip_invalid)
        if reuse is not None and model is None:
            refuse_other_model(read, reuse.model)
    except BaseException as err:
        if writer is not None:
            with suppress(OSError):
                spool.remove(output, batch_id)  # a refused or interrupted submission leaves nothing behind
        if reuser is not None:
            reuser.discard()
        if isinstance(err, OSError):
            raise MiroError(
                f"Cannot store the batch's requests under '{redacted(output)}': {str(err.strerror or err).rstrip('.')}."
            ) from None
        raise
    reused = reuser.reused if reuser is not None else 0
    log(
        f"Validated {scan.lines:,} lines in {read.validate_s:.2f} s: {scan.valid:,} valid, {scan.invalid:,} invalid"
        + (f"; {reused:,} reuse earlier rows." if reuser is not None else ".")
    )
    model = (
        redis_call(conn, lambda: routing.choose_model(conn, model, read.named, scan.task, read.more_models))
        if conn
        else routing.choose_model(None, model, read.named, scan.task, read.more_models)
    )
    if conn is None and not routing.is_known(None, model):
        log(
            f"Note: model '{model}' is no alias and no .gguf file here; whether a worker serves it is known "
            f"only to Redis, which a dry run does not ask."
        )
    priority = priority or DEFAULT_PRIORITY
    queue = routing.priority_queue(queue_name or routing.queue_for(model), priority)
    result = SubmitResult.of_read(
        read,
        batch_id=batch_id,
        queue=queue,
        priority=priority,
        dry_run=dry_run,
        stored=scan.valid - reused if writer is not None else 0,
        reused=reused,
    )
    if dry_run:
        return result
    try:
        redis_call(
            conn,
            lambda: batches.create_batch(
                conn,
                batch_id=batch_id,
                name=name if name is not None else Path(path).name,
                model=model,
                input_file=os.path.abspath(path),
                output=output,
                total=scan.valid,
                queue=queue,
                priority=priority,
                job_timeout=timeout,
                task=scan.task,
                endpoint=endpoint or ",".join(e for e in read.endpoints if e),
                completion_window=completion_window,
                chunks=chunks,
                spooled=scan.valid - reused,
                requests_per_job=requests_per_job,
            ),
        )
    except BaseException:
        spool.remove(output, batch_id)
        if reuser is not None:
            reuser.discard()
        raise
    started = time.perf_counter()
    try:
        if reuser is not None:
            reuser.count(conn)  # their rows are written: counted completed, as a worker counts what it wrote
        result.recorded_invalid = record_invalid(conn, batch_id, read)
        while (fed := feed.feed(conn, batch_id)) > 0:  # the first window
            result.enqueued += fed
        result.enqueue_s = time.perf_counter() - started
        batches.set_status(conn, batch_id, "in_progress")
        if reused:
            batches.settle(conn, batch_id)  # every request reused (or invalid): nothing will count it complete
    except redis.RedisError as e:
        raise MiroError(
            f"Redis failed after batch {batch_id} was recorded ({str(e).rstrip('.')}); run the same "
            f"command with --resume {batch_id} to go on."
        ) from None
    return result
