"""miro-submit: validate a JSONL dataset in one streaming pass, store its requests, write the batch record and
enqueue the first window of RQ jobs.

Each valid line goes into the batch's stored requests (spool.py) as it is read, so the submitter holds one line and
one chunk at a time; custom ids are remembered in 12 bytes a slot (seen_ids.py, about 18 bytes a line) for big
files, the one thing kept per line. Invalid lines are
reported as they are found (`on_line_error`). Only when the whole file is read and no line is invalid (or
`skip_invalid`) is the batch record written and the first window fed (feed.py); a refused file leaves nothing
behind. The feeder turns the rest into jobs as the fleet drains the queue. `resume` (resume.py) runs again what an
existing batch has not finished.
"""

from __future__ import annotations

import os
import re
import time
from contextlib import suppress
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Iterator

import redis

from miro.core import defaults
from miro.core.defaults import PRIORITY as DEFAULT_PRIORITY
from miro.core.errors import MiroError
from miro.worker.fleet.records import batches, connection
from miro.worker.fleet.intake import durations, feed, routing, spool, tables
from miro.worker.fleet.intake.columns import InputColumns
from miro.worker.fleet.intake.reuse import OtherModel, Reuser, ReuseSource
from miro.worker.fleet.output import storage
from miro.worker.fleet.intake.dataset import DatasetScan, FirstLines, scan_dataset
from miro.worker.fleet.intake.inputs import LineError
from miro.worker.fleet.records.payload import Request
from miro.worker.fleet.intake.resume import Resumer, known_requests
from miro.worker.fleet.observe.urls import redacted

CHUNK = defaults.SPOOL_CHUNK
JOB_TIMEOUT_S, COMPLETION_WINDOW = (
    defaults.JOB_TIMEOUT_S,
    defaults.COMPLETION_WINDOW,
)  # SubmitOptions' (a field is named defaults)
BIG_FILE_LINES = 200_000  # from about this many lines custom ids are remembered by hash (seen_ids.SeenIds)
NAMED_MODELS_KEPT = 5  # models the lines name that are remembered: a batch runs on one, so more is a refusal anyway


class InvalidDataset(MiroError):
    """Some lines are invalid and --skip-invalid was not given: nothing was enqueued."""

    def __init__(self, errors: list[LineError], lines: int):
        self.errors = errors
        self.lines = lines
        n = len(errors)
        super().__init__(
            f"{n:,} of {lines:,} lines {'is' if n == 1 else 'are'} invalid, so nothing was enqueued "
            f"(fix {'it' if n == 1 else 'them'}, or pass --skip-invalid to enqueue the valid lines)."
        )


@dataclass
class SubmitResult:
    batch_id: str | None  # None for a dry run
    queue: str
    priority: str
    lines: int  # request lines read: valid + invalid
    valid: int
    invalid: list[LineError] = field(default_factory=list)
    task: str = "generate"  # what the batch does: "generate" or "embed"
    enqueued: int = 0  # requests queued now (the first window of a new batch; --resume: those queued again)
    stored: int = 0  # requests in the batch's storage, fed to the queue as the fleet drains it
    recorded_invalid: int = 0  # invalid lines newly recorded as failed requests (--skip-invalid)
    already_finished: int = 0  # --resume: requests whose job finished
    in_flight: int = 0  # --resume: requests whose job is queued, started, scheduled or deferred
    expired: int = 0  # --resume: requests whose job had expired from Redis and was enqueued again
    reused: int = 0  # --reuse: requests whose earlier rows are this batch's (not stored, never run)
    unfed: int = 0  # --resume: stored requests a cancel or expiry had left unfed, fed again
    dry_run: bool = False
    resumed: bool = False
    validate_s: float = 0.0
    enqueue_s: float = 0.0

    @property
    def jobs_per_s(self) -> float:
        return self.enqueued / self.enqueue_s if self.enqueue_s > 0 else 0.0


def output_uri(output: str) -> str:
    """A URI (s3://..., gs://..., file://...) as given; a local path made absolute, so workers agree on it."""
    if storage.is_uri(output):
        return output
    return os.path.abspath(os.path.expanduser(output))


def _invalid_ids(errors: list[LineError], taken: set[str]) -> list[tuple[str, LineError]]:
    """A custom id per invalid line that clashes with no valid request and no other invalid line (`taken`: the
    custom ids of the valid requests that invalid lines name; the others cannot clash)."""
    out = []
    for error in errors:
        cid = error.custom_id
        if not cid or cid in taken:
            cid = f"line-{error.line}"
            if cid in taken:
                cid = f"line-{error.line}-invalid"
        taken.add(cid)
        out.append((cid, error))
    return out


def _seen_ids(path: str | Path, fmt: str = "jsonl"):
    """What remembers the file's custom ids: a dict for a small file, 12 bytes an id for a big one (pre-sized by
    the file's size, as growing its table costs twice the memory)."""
    from miro.worker.fleet.intake import seen_ids

    if fmt != "jsonl":
        expected = tables.estimated_rows(path, fmt)
    else:
        expected = seen_ids.estimated_lines(path) if os.path.isfile(path) else 0
    return seen_ids.SeenIds(int(expected * 1.1)) if expected >= BIG_FILE_LINES else FirstLines()


@dataclass
class _Read:
    """What one pass over the file gathered beside the stored requests."""

    scan: DatasetScan
    seen: object  # the valid requests' custom ids (dataset.FirstLines or seen_ids.SeenIds)
    errors: list[LineError] = field(default_factory=list)
    # model a line names -> the first line naming it: the first NAMED_MODELS_KEPT (a line per model could name a
    # million), `more_models` when others were named too
    named: dict[str, int] = field(default_factory=dict)
    more_models: bool = False
    endpoints: dict[str, None] = field(default_factory=dict)  # in order of first use (a few known urls)
    validate_s: float = 0.0

    def taken_ids(self) -> set[str]:
        """The valid custom ids an invalid line's name could clash with (_invalid_ids): of the names it could take
        (its own custom id, line-N, line-N-invalid), those `seen` holds. Looked up there rather than gathered while
        reading, which cost a set entry per line of a file without ids (their ids are line-N)."""
        names = set()
        for error in self.errors:
            names.update(
                (error.custom_id, f"line-{error.line}", f"line-{error.line}-invalid")
                if error.custom_id
                else (f"line-{error.line}", f"line-{error.line}-invalid")
            )
        return {cid for cid in names if cid in self.seen}

    def take(self, items: Iterator[Request | LineError], on_line_error) -> Iterator[Request]:
        """The valid requests of `items`, noting the rest."""
        started = time.perf_counter()
        for item in items:
            if isinstance(item, LineError):
                self.errors.append(item)
                if on_line_error is not None:
                    on_line_error(item)
                continue
            if item.requested_model is not None and item.requested_model not in self.named:
                if len(self.named) < NAMED_MODELS_KEPT:
                    self.named[item.requested_model] = item.line
                else:
                    self.more_models = True
            self.endpoints.setdefault(endpoint_of(item))
            yield item
        self.validate_s = time.perf_counter() - started


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
    timeout = _job_timeout(job_timeout)
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

    def read_file(progress=on_progress, line_errors=on_line_error) -> tuple[_Read, Iterator[Request]]:
        read = _Read(DatasetScan(), seen=_seen_ids(path, fmt))
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
        return _resume(conn, resume, queue_name, model, priority, read_file, skip_invalid, chunk_size, log)
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
        _refuse_unusable(read, skip_invalid)
        if reuse is not None and model is None:
            _refuse_other_model(read, reuse.model)
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
        _redis(conn, lambda: routing.choose_model(conn, model, read.named, scan.task, read.more_models))
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
    result = SubmitResult(
        batch_id=batch_id,
        queue=queue,
        priority=priority,
        lines=scan.lines,
        valid=scan.valid,
        invalid=read.errors,
        task=scan.task,
        dry_run=dry_run,
        validate_s=read.validate_s,
        stored=scan.valid - reused if writer is not None else 0,
        reused=reused,
    )
    if dry_run:
        return result
    try:
        _redis(
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
        result.recorded_invalid = _record_invalid(conn, batch_id, read)
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


def _refuse_unusable(read: _Read, skip_invalid: bool) -> None:
    scan = read.scan
    if scan.file_error:
        raise MiroError(f"{scan.file_error.rstrip('.')}; nothing was enqueued.")
    if read.errors and not skip_invalid:
        raise InvalidDataset(read.errors, scan.lines)
    if not scan.valid:
        raise MiroError(f"None of the {scan.lines:,} lines is valid, so nothing was enqueued.")


def _refuse_other_model(read: _Read, model: str) -> None:
    """Lines given no --model run on the model they name (or their task's default): refused unless that is `model`,
    the one the reused rows were made with."""
    chosen = routing.choose_model(None, None, read.named, read.scan.task, read.more_models)
    if chosen != model:
        named = (
            f"line {read.named[chosen]} names '{chosen}'" if chosen in read.named else f"the lines run on '{chosen}'"
        )
        raise OtherModel(
            f"The results to reuse were made with '{model}', but {named}: a batch reuses only rows of the model "
            "it runs on, so its lines must name that model; nothing was enqueued."
        )


def _record_invalid(conn: redis.Redis, batch_id: str, read: _Read) -> int:
    """Record each invalid line (--skip-invalid) as a failed request of the batch; returns how many were new."""
    if not read.errors:
        return 0
    recorded = 0
    invalid = _invalid_ids(read.errors, read.taken_ids())
    for start in range(0, len(invalid), CHUNK):
        chunk = invalid[start : start + CHUNK]
        known = known_requests(conn, batch_id, [cid for cid, _ in chunk])
        pipe = conn.pipeline(transaction=True)
        for (cid, error), is_request in zip(chunk, known):
            if not is_request:  # --resume of an edited file: leave existing requests alone
                batches.record_failed_line(pipe, batch_id, custom_id=cid, line=error.line, error=error.message)
        recorded += sum(pipe.execute())
    return recorded


def _chunks(requests: Iterator[Request], size: int) -> Iterator[list[Request]]:
    chunk: list[Request] = []
    for request in requests:
        chunk.append(request)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _resume(
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
    batch = _redis(conn, lambda: batches.get_batch(conn, batch_id))
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
    _refuse_unusable(read, skip_invalid)
    scan = read.scan
    if scan.task != batch.task:
        raise MiroError(
            f"Batch {batch_id} {'embeds' if batch.task == 'embed' else 'generates'}, but the lines of "
            f"this file {'embed' if scan.task == 'embed' else 'generate'}; resume it with the same --task."
        )
    log(f"Validated {scan.lines:,} lines in {read.validate_s:.2f} s: {scan.valid:,} valid, {scan.invalid:,} invalid.")
    result = SubmitResult(
        batch_id=batch_id,
        queue=batch.queue,
        priority=batch.priority,
        lines=scan.lines,
        valid=scan.valid,
        invalid=read.errors,
        task=scan.task,
        resumed=True,
        stored=batch.spooled,
        validate_s=read.validate_s,
    )
    resumer = Resumer(conn, batch, result)
    started = time.perf_counter()
    try:
        result.recorded_invalid = _record_invalid(conn, batch_id, read)
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


KIND_ENDPOINTS = {"chat": "/v1/chat/completions", "completion": "/v1/completions", "embedding": "/v1/embeddings"}


def endpoint_of(request: Request) -> str:
    """The OpenAI endpoint a line is for (a simple line's by its kind)."""
    return request.url or KIND_ENDPOINTS.get(request.kind, "")


def _redis(conn: redis.Redis, call):
    """Run a Redis call before anything is enqueued; a Redis problem becomes one sentence."""
    try:
        return call()
    except (redis.ConnectionError, redis.TimeoutError) as e:
        raise MiroError(f"Cannot reach Redis at {connection.url_of(conn)}: {str(e).rstrip('.')}.") from None
    except redis.RedisError as e:
        raise MiroError(f"Redis failed before anything was enqueued ({str(e).rstrip('.')}).") from None


def _job_timeout(value: int | str | None) -> int:
    if value is None:
        return defaults.JOB_TIMEOUT_S
    text = str(value).strip().lower()
    match = re.fullmatch(r"(-1|\d+)([smhd]?)", text)
    seconds = int(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match[2]] if match else 0
    if not match or seconds == 0 or (seconds == -1 and match[2]):
        raise MiroError(f"The job timeout '{value}' is not valid: give seconds (3600), or 30m, 2h, 1d, or -1 for none.")
    return seconds
