"""miro-submit: validate a JSONL dataset, write the batch record and enqueue one RQ job per request.

Every line is validated before anything is written. Jobs are plain RQ jobs (JSON serializer, function
``miro.worker.jobs.generate``, kwargs = the request payload, meta = batch id and custom id) with ids fixed
by batch id and custom id; they are written in chunks of CHUNK jobs, one Lua script per chunk (atomic, so
a chunk is either wholly enqueued or not at all), and ``resume`` finishes an interrupted submission.
"""

from __future__ import annotations

import os
import re
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import redis
from rq import Queue, Retry
from rq.job import Job, JobStatus
from rq.registry import CanceledJobRegistry, FailedJobRegistry
from rq.results import Result
from rq.serializers import JSONSerializer
from rq.utils import now as rq_now

from miro.core import defaults
from miro.core.defaults import PRIORITY as DEFAULT_PRIORITY
from miro.core.errors import MiroError
from miro.worker.fleet import batches, durations, keys, routing, scripts, storage
from miro.worker.fleet.inputs import LineError, Request, parse_dataset
from miro.worker.fleet.payload import JobPayload

JOB_FUNCTION = "miro.worker.jobs.generate"
RESULT_TTL = FAILURE_TTL = 7 * 24 * 3600
ABANDONED_RETRIES = 3  # runs again of a job whose worker died
CHUNK = 1000

# RQ statuses under which a job will still run (or is running): --resume leaves these alone.
_IN_FLIGHT = frozenset({
    JobStatus.QUEUED, JobStatus.STARTED, JobStatus.DEFERRED, JobStatus.SCHEDULED,
    JobStatus.RATE_LIMITED, JobStatus.READY_TO_ENQUEUE,
})


_OWN_FIELDS = ("data", "meta", "description")



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
    enqueued: int = 0
    recorded_invalid: int = 0  # invalid lines newly recorded as failed requests (--skip-invalid)
    already_finished: int = 0  # --resume: requests whose job finished
    in_flight: int = 0  # --resume: requests whose job is queued, started, scheduled or deferred
    expired: int = 0  # --resume: requests whose job had expired from Redis and was enqueued again
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


def payload(request: Request, batch_id: str, model: str, priority: str = DEFAULT_PRIORITY) -> JobPayload:
    """Everything the worker needs to run the request and write its rows."""
    return JobPayload(batch_id=batch_id, custom_id=request.custom_id, kind=request.kind, model=model,
                      priority=priority,
                      sampling=request.sampling, prompt=request.prompt if request.kind == "completion" else None,
                      messages=request.messages if request.kind in ("chat", "response") else None,
                      inputs=request.inputs, pooling=request.pooling, encoding_format=request.encoding_format,
                      response=request.response,
                      requested_model=request.model, line=request.line, extra=request.extra)


def _invalid_ids(errors: list[LineError], taken: set[str]) -> list[tuple[str, LineError]]:
    """A custom id per invalid line that clashes with no valid request and no other invalid line."""
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


class _Enqueuer:
    """Builds RQ jobs for requests and writes them, a chunk per script."""

    def __init__(self, conn: redis.Redis, queue_name: str, batch_id: str, model: str, priority: str,
                 job_timeout: int, output: str = ""):
        self.conn = conn
        self.output = output  # where the batch's part files are: --resume reads which requests have rows
        self._with_rows: set[str] | None = None
        self.queue = Queue(queue_name, connection=conn, serializer=JSONSerializer)
        self.batch_id = batch_id
        self.model = model
        self.priority = priority
        self.job_timeout = job_timeout
        self.jobs_key = keys.batch_jobs(batch_id)

    def job(self, request: Request, enqueued_at) -> Job:
        """The request as an RQ Job built by RQ itself (status queued, enqueued now)."""
        job = self.queue.create_job(
            JOB_FUNCTION, kwargs=payload(request, self.batch_id, self.model, self.priority).to_kwargs(),
            job_id=batches.job_id(self.batch_id, request.custom_id),
            meta={"batch_id": self.batch_id, "custom_id": request.custom_id},
            timeout=self.job_timeout, result_ttl=RESULT_TTL, failure_ttl=FAILURE_TTL,
            description=f"{self.batch_id} {request.custom_id[:100]}", status=JobStatus.QUEUED,
            # a job whose worker died (kill -9, lost machine) is found by RQ's maintenance once its heartbeat
            # expires and is queued again while retries remain
            retry=Retry(max=ABANDONED_RETRIES),
        )
        job.created_at = job.enqueued_at = enqueued_at
        return job

    def shared_fields(self, request: Request, enqueued_at) -> dict:
        """The fields of the job hash RQ writes that are the same for every job of a chunk."""
        mapping = self.job(request, enqueued_at).to_dict()
        for own in _OWN_FIELDS:
            del mapping[own]
        return mapping

    def own_fields(self, request: Request) -> tuple[bytes, bytes, str]:
        """data, meta and description of the request's job hash, encoded as RQ's Job.to_dict encodes them."""
        dumps = JSONSerializer.dumps
        kwargs = payload(request, self.batch_id, self.model, self.priority).to_kwargs()
        data = zlib.compress(dumps((JOB_FUNCTION, None, (), kwargs)))
        return data, dumps({"batch_id": self.batch_id, "custom_id": request.custom_id}), \
            f"{self.batch_id} {request.custom_id[:100]}"

    def write(self, pipe, requests: list[Request]) -> None:
        """Queue on `pipe` one EVAL that writes what RQ's enqueue writes for each request (the job hash with
        status queued, the id pushed on the queue, the queue in rq:queues) and the custom id -> job id entries.

        RQ builds the first job; every job hash is that job's fields with its own data, meta and description
        (tests/worker/test_submit.py checks each stored hash equals RQ's own Job.to_dict()). One script per chunk
        sends the shared fields once instead of once per job: on 2 cores about 21,000 jobs/s, against 10,000
        for a pipeline of HSETs and 5,400 for RQ's own enqueue_many.
        """
        shared = self.shared_fields(requests[0], rq_now())
        ids = [batches.job_id(self.batch_id, r.custom_id) for r in requests]
        args: list = [len(shared)]
        for name, value in shared.items():
            args += (name, value)
        for request, jid in zip(requests, ids):
            args += (jid, request.custom_id, *self.own_fields(request))
        job_keys = [Job.key_for(jid) for jid in ids]
        scripts.WRITE_JOBS(pipe, [self.queue.key, self.queue.redis_queues_keys, self.jobs_key, *job_keys], args)

    def enqueue_new(self, requests: list[Request]) -> None:
        pipe = self.conn.pipeline(transaction=False)  # one script: atomic by itself
        self.write(pipe, requests)
        pipe.execute()

    def resume_chunk(self, requests: list[Request], result: SubmitResult) -> None:
        """Enqueue the requests of the chunk that have no job that finished or will still run."""
        job_keys = [Job.key_for(batches.job_id(self.batch_id, r.custom_id)) for r in requests]
        statuses = self._released_as(requests, self._statuses(job_keys))
        candidates = [i for i, s in enumerate(statuses) if s != JobStatus.FINISHED and s not in _IN_FLIGHT]
        result.already_finished += sum(s == JobStatus.FINISHED for s in statuses)
        result.in_flight += sum(s in _IN_FLIGHT for s in statuses)
        if not candidates:
            return
        invalid_key = keys.batch_invalid(self.batch_id)

        def attempt(pipe) -> None:  # anything read changing before EXEC makes EXEC fail: read again
            chosen = [requests[i] for i in candidates]
            again = self._released_as(chosen, self._statuses([job_keys[i] for i in candidates]))
            reader = self.conn.pipeline(transaction=False)
            reader.hmget(self.jobs_key, [r.custom_id for r in chosen])
            reader.hmget(invalid_key, [r.custom_id for r in chosen])
            known, was_invalid = reader.execute()
            keep = [k for k, s in enumerate(again) if s != JobStatus.FINISHED and s not in _IN_FLIGHT]
            if keep:
                pipe.multi()
                self._reset(pipe, [(chosen[k], again[k], known[k], was_invalid[k]) for k in keep])
                self.write(pipe, [chosen[k] for k in keep])
                pipe.execute()
            else:
                pipe.unwatch()
            finished_now = sum(s == JobStatus.FINISHED for s in again)
            result.already_finished += finished_now
            result.in_flight += len(again) - len(keep) - finished_now
            result.expired += sum(again[k] is None and known[k] is not None for k in keep)
            result.enqueued += len(keep)

        scripts.watched(self.conn, [self.jobs_key, invalid_key, *(job_keys[i] for i in candidates)], attempt,
                        f"Batch {self.batch_id}")

    def _statuses(self, job_keys: list[str]) -> list[JobStatus | None]:
        reader = self.conn.pipeline(transaction=False)
        for key in job_keys:
            reader.hget(key, "status")
        return [JobStatus(s.decode()) if s else None for s in reader.execute()]

    def _released_as(self, requests: list[Request], statuses: list[JobStatus | None]) -> list[JobStatus | None]:
        """What the requests whose job hash is gone were: once a batch ended, its finished and cancelled jobs' keys
        went (release.py), and a request that was counted but has no row in the part files was cancelled."""
        gone = [i for i, status in enumerate(statuses) if status is None]
        if not gone:
            return statuses
        custom_ids = [requests[i].custom_id for i in gone]
        reader = self.conn.pipeline(transaction=False)
        reader.hmget(self.jobs_key, custom_ids)
        reader.smismember(keys.batch_counted(self.batch_id), custom_ids)
        known, counted = reader.execute()
        out = list(statuses)
        for i, custom_id, job, was_counted in zip(gone, custom_ids, known, counted):
            if job is not None and was_counted:
                out[i] = JobStatus.FINISHED if custom_id in self.with_rows() else JobStatus.CANCELED
        return out

    def with_rows(self) -> set[str]:
        """The custom ids with a row in the batch's part files (read once per submit)."""
        if self._with_rows is None:
            from miro.worker.fleet.results import read_parts  # pyarrow: only a resume of an ended batch needs it

            self._with_rows = set(read_parts(self.output, self.batch_id).column("custom_id").to_pylist())
        return self._with_rows

    def _reset(self, pipe, rows: Iterable[tuple[Request, JobStatus | None, bytes | None, bytes | None]]) -> None:
        """Clear what an earlier run of each job left and keep the batch counters right (see batches.py)."""
        failed = FailedJobRegistry(self.queue.name, connection=self.conn, serializer=JSONSerializer)
        canceled = CanceledJobRegistry(self.queue.name, connection=self.conn, serializer=JSONSerializer)
        batch_key = keys.batch(self.batch_id)
        for request, status, known, was_invalid in rows:
            jid = batches.job_id(self.batch_id, request.custom_id)
            if status is not None:
                pipe.zrem(failed.key, jid)
                pipe.zrem(canceled.key, jid)
            pipe.delete(Job.key_for(jid), Result.get_key(jid))
            if status in (JobStatus.FAILED, JobStatus.CANCELED):  # its next run counts again
                counter = "failed" if status == JobStatus.FAILED else "cancelled"
                batches.uncount(pipe, self.batch_id, request.custom_id, counter)
            else:
                pipe.srem(keys.batch_counted(self.batch_id), request.custom_id)
            if known is None:  # a request new to the batch (or one that was an invalid line before)
                pipe.hincrby(batch_key, "total", 1)
                if was_invalid is not None:
                    pipe.hdel(keys.batch_invalid(self.batch_id), request.custom_id)
                    pipe.hincrby(batch_key, "total", -1)
                    pipe.hincrby(batch_key, "failed", -1)


def _chunks(items: list, size: int) -> Iterable[list]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def submit(conn: redis.Redis | None, path: str | Path, *, queue_name: str | None = None, name: str | None = None,
           output: str = defaults.OUTPUT, model: str | None = None, defaults: dict | None = None,
           skip_invalid: bool = False, dry_run: bool = False, resume: str | None = None,
           job_timeout: int | str | None = defaults.JOB_TIMEOUT_S, chunk_size: int = CHUNK,
           priority: str | None = None, endpoint: str | None = None, task: str | None = None,
           pooling_defaults: dict | None = None, completion_window: str = defaults.COMPLETION_WINDOW,
           log: Callable[[str], None] | None = None) -> SubmitResult:
    """Validate the dataset at `path` and enqueue one job per valid request; see the module docstring.

    `conn` may be None for a dry run (which touches no Redis key). `priority` (high, normal or low; None is
    normal) picks the queue (routing.priority_queue) and is recorded in the batch record and in every job.
    With `resume=BATCH` the requests go to that existing batch (its queue, model, priority and output); only
    custom ids without a finished or still running job are enqueued. With `endpoint` (an OpenAI batch's) every
    line must be an OpenAI Batch line with that url (inputs.parse_dataset). `task` ("generate" or "embed"; None:
    the first line's) is what the batch does, `defaults` and `pooling_defaults` the sampling and pooling options of
    lines without them (parse_dataset). `completion_window` ("24h", "30m", ...) is how long the batch may run
    before what has not run expires (expiry.py); a resumed batch keeps its own, renewed from now if it has
    passed. Raises InvalidDataset (nothing enqueued) when a line is invalid and not `skip_invalid`,
    MiroError for other problems a user can cause.
    """
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

    batch = None
    if resume is not None and not dry_run:
        batch = _redis(conn, lambda: batches.get_batch(conn, resume))
        if batch.status in ("cancelling", "expiring"):
            raise MiroError(f"Batch {resume} is {batch.status}; resume it once it is "
                            f"{'cancelled' if batch.status == 'cancelling' else 'expired'}.")
        batch.queue = routing.upgrade_recorded_queue(conn, batch.id, batch.queue, batch.priority)
        queue = routing.priority_queue(queue_name, batch.priority) if queue_name is not None else None
        for option, value, recorded in (("queue", queue, batch.queue), ("model", model, batch.model),
                                        ("priority", priority, batch.priority)):
            if value is not None and value != recorded:
                raise MiroError(f"Batch {resume} uses {option} '{recorded}', not '{value}'; leave --{option} out.")

    started = time.perf_counter()
    parsed = parse_dataset(path, defaults, endpoint=endpoint, task=task, pooling_defaults=pooling_defaults)
    validate_s = time.perf_counter() - started
    lines = len(parsed.requests) + len(parsed.errors)
    if parsed.file_error:
        raise MiroError(f"{parsed.file_error.rstrip('.')}; nothing was enqueued.")
    if parsed.errors and not skip_invalid:
        raise InvalidDataset(parsed.errors, lines)
    if not parsed.requests:
        raise MiroError(f"None of the {lines:,} lines is valid, so nothing was enqueued.")
    if batch is not None and parsed.task != batch.task:
        raise MiroError(f"Batch {resume} {'embeds' if batch.task == 'embed' else 'generates'}, but the lines of this "
                        f"file {'embed' if parsed.task == 'embed' else 'generate'}; resume it with the same --task.")
    log(f"Validated {lines:,} lines in {validate_s:.2f} s: {len(parsed.requests):,} valid, "
        f"{len(parsed.errors):,} invalid.")
    if batch is None:
        named: dict[str, int] = {}
        for request in parsed.requests:
            if request.model is not None:
                named.setdefault(request.model, request.line)
        model = _redis(conn, lambda: routing.choose_model(conn, model, named, parsed.task)) if conn else \
            routing.choose_model(None, model, named, parsed.task)
        if conn is None and not routing.is_known(None, model):
            log(f"Note: model '{model}' is no alias and no .gguf file here; whether a worker serves it is known "
                f"only to Redis, which a dry run does not ask.")

    if batch is None:
        priority = priority or DEFAULT_PRIORITY
        queue = routing.priority_queue(queue_name or routing.queue_for(model), priority)
    else:
        priority, queue = batch.priority, batch.queue
    result = SubmitResult(batch_id=resume, queue=queue, priority=priority, lines=lines, valid=len(parsed.requests),
                          invalid=parsed.errors, task=parsed.task, dry_run=dry_run,
                          resumed=resume is not None, validate_s=validate_s)
    if dry_run:
        return result

    valid_ids = {r.custom_id for r in parsed.requests}
    invalid = _invalid_ids(parsed.errors, set(valid_ids))
    if batch is None:
        result.batch_id = _redis(conn, lambda: batches.create_batch(
            conn, name=name if name is not None else Path(path).name, model=model,
            input_file=os.path.abspath(path), output=output_uri(output), total=len(parsed.requests),
            queue=result.queue, priority=priority, job_timeout=timeout, task=parsed.task,
            endpoint=endpoint or batch_endpoint(parsed.requests), completion_window=completion_window))
        batch = _redis(conn, lambda: batches.get_batch(conn, result.batch_id))
    batch_id = result.batch_id
    enqueuer = _Enqueuer(conn, result.queue, batch_id, batch.model, priority, timeout, batch.output)

    started = time.perf_counter()
    try:
        if invalid:
            known = set(conn.hkeys(keys.batch_jobs(batch_id)))
            pipe = conn.pipeline(transaction=True)
            for cid, error in invalid:
                if cid.encode() not in known:  # --resume of an edited file: leave existing requests alone
                    batches.record_failed_line(pipe, batch_id, custom_id=cid, line=error.line, error=error.message)
            result.recorded_invalid = sum(pipe.execute())
        for chunk in _chunks(parsed.requests, chunk_size):
            if result.resumed:
                enqueuer.resume_chunk(chunk, result)
            else:
                enqueuer.enqueue_new(chunk)
                result.enqueued += len(chunk)
        result.enqueue_s = time.perf_counter() - started
        if result.enqueued and batch.expires_at is not None and batch.expires_at <= time.time():
            batches.renew_window(conn, batch)  # resumed past its window (expired, say): it starts again from now
        if result.enqueued or batch.status == "validating":
            batches.set_status(conn, batch_id, "in_progress")
    except redis.RedisError as e:
        done = f"{result.enqueued:,} of {len(parsed.requests):,} jobs" if result.enqueued else "no jobs"
        raise MiroError(
            f"Redis failed after {done} of batch {batch_id} were enqueued ({str(e).rstrip('.')}); run the same "
            f"command with --resume {batch_id} to enqueue the rest."
        ) from None
    return result


KIND_ENDPOINTS = {"chat": "/v1/chat/completions", "completion": "/v1/completions", "embedding": "/v1/embeddings"}


def batch_endpoint(requests: list[Request]) -> str:
    """The OpenAI endpoint a batch's lines are for (a simple line's by its kind); several, comma separated."""
    found = dict.fromkeys(request.url or KIND_ENDPOINTS.get(request.kind, "") for request in requests)
    return ",".join(endpoint for endpoint in found if endpoint)


def _redis(conn: redis.Redis, call):
    """Run a Redis call before anything is enqueued; a Redis problem becomes one sentence."""
    try:
        return call()
    except (redis.ConnectionError, redis.TimeoutError) as e:
        raise MiroError(f"Cannot reach Redis at {batches.url_of(conn)}: {str(e).rstrip('.')}.") from None
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
