"""Batch records in Redis: the `miro:batch:{id}` hash, the `miro:batches` index and the invalid-line record.

Counters (total, completed, failed, cancelled, prompt_tokens, cached_tokens, completion_tokens) are written as 0 when
the record is made and move only with HINCRBY afterwards. Their meaning, shared by every writer:

- ``total``: requests of the batch, one per custom id: every enqueued job plus every invalid line recorded
  with ``record_failed_line`` (``--skip-invalid``).
- ``failed``: invalid lines recorded, plus jobs that ended in RQ status FAILED (the worker adds those). A
  ``--resume`` that enqueues a FAILED job again takes it back out of ``failed``.
- ``completed``: jobs that finished (the worker adds those).
- ``cancelled``: requests of a cancelled or expired batch that did not run: queued jobs `miro cancel` (or expiry,
  expiry.py) removed, jobs a worker aborted or refused because their batch was being cancelled or expiring. A
  ``--resume`` takes them back out. In an expired batch these are the expired requests (``BatchRecord.expired``).
- ``prompt_tokens``, ``cached_tokens`` (prompt tokens served from the prefix cache), ``completion_tokens``: summed
  over the completed requests, once per custom id, by the same count that counts them.

Once completed + failed + cancelled reaches total, the batch settles: ``in_progress`` becomes ``completed``
(stamping ``finalizing_at`` and ``completed_at`` together), ``cancelling`` becomes ``cancelled``, ``expiring``
becomes ``expired``; the batch id goes into ``miro:ended-batches`` for `miro serve` to write its result files.

A batch has a completion window (``--completion-window``, OpenAI's ``24h`` by default): ``expires_at`` is its
creation time plus the window, and ``miro:batch-deadlines`` scores the batch by it, so whoever runs batches (every
worker, and `miro serve`) finds the due ones cheaply and expires them (expiry.py).

Status follows the OpenAI Batch lifecycle; every change stamps ``{status}_at`` (epoch seconds).

`BatchRecord` is the hash as Python reads it: every reader takes its figures (``done``, ``remaining``, the
time in progress) from the record rather than summing the counters itself.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from miro.core import defaults
from miro.core.errors import MiroError
from miro.worker.fleet.intake import durations
from miro.worker.fleet.records import hashes, keys, scripts

STATUSES = (
    "validating",
    "in_progress",
    "finalizing",
    "completed",
    "failed",
    "cancelling",
    "cancelled",
    "expiring",
    "expired",
)
TERMINAL = frozenset({"completed", "failed", "cancelled", "expired"})
# a batch in one of these has its queued requests taken off and those in flight aborted, and runs nothing more
STOPPING = frozenset({"cancelling", "cancelled", "expiring", "expired"})

# new status -> the statuses it may follow. Terminal statuses go back to in_progress only through --resume.
ALLOWED_FROM = {
    "validating": frozenset(),
    "in_progress": frozenset({"validating", "finalizing", "completed", "failed", "cancelled", "expired"}),
    "finalizing": frozenset({"in_progress"}),
    "completed": frozenset({"finalizing", "in_progress"}),
    "failed": frozenset({"validating", "in_progress", "finalizing"}),
    "cancelling": frozenset({"validating", "in_progress", "finalizing"}),
    "cancelled": frozenset({"cancelling"}),
    # expiry is a cancel by the clock: the requests not yet run are counted cancelled, and shown as batch_expired
    "expiring": frozenset({"in_progress", "finalizing"}),
    "expired": frozenset({"expiring"}),
}

BATCH_ID_RE = re.compile(r"batch_[0-9a-f]{24}")


@dataclass
class BatchRecord:
    """The `miro:batch:{id}` hash (the module docstring says what each counter means)."""

    id: str
    status: str
    created_at: float  # epoch seconds
    name: str = ""
    model: str = ""
    input_file: str = ""
    output: str = ""  # where the workers write the part files
    queue: str = ""
    priority: str = defaults.PRIORITY  # records made before priorities existed are normal
    task: str = "generate"  # "generate" or "embed" (inputs.TASKS): which columns its results have
    job_timeout: int | None = None
    endpoint: str = ""  # the OpenAI endpoint its lines are for (/v1/chat/completions, ...); "" in older records
    completion_window: str = ""  # as given ("24h", "30m"); "" in records made before windows existed: no expiry
    expires_at: float | None = None  # created_at + the window (epoch seconds); None: never expires
    total: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, those served from the prefix cache
    completion_tokens: int = 0
    # its requests in storage (spool.py), fed to the queue a chunk at a time (feed.py); 0 chunks in older records
    chunks: int = 0  # chunk files of stored requests
    spooled: int = 0  # requests in them
    fed: int = 0  # chunks made into RQ jobs so far, in order
    fed_requests: int = 0  # the requests in them
    feed_closed: int = 0  # 1 once a cancel or expiry stopped the feeding: what was not fed is counted cancelled
    unfed_cancelled: int = 0  # how many requests that was (a resume takes them back)
    requests_per_job: int = 1  # the feeder's group jobs hold this many requests each (1: a job per request, as before)
    stamps: dict[str, float] = field(default_factory=dict)  # status -> when the batch last took it

    @staticmethod
    def key(batch_id: str) -> str:
        return keys.batch(batch_id)

    @classmethod
    def from_hash(cls, raw) -> BatchRecord:
        values = hashes.decoded(raw)
        stamps = {
            k.removesuffix("_at"): float(v)
            for k, v in values.items()
            if k.endswith("_at") and k.removesuffix("_at") in STATUSES
        }
        return cls(**hashes.field_values(cls, values), stamps=stamps)

    def to_hash(self) -> dict[str, str | int | float]:
        return {**hashes.hash_values(self), **{f"{status}_at": f"{t:.3f}" for status, t in self.stamps.items()}}

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON (`miro status --json`): the hash's fields, stamps as ``{status}_at``, and the
        derived counts."""
        return {
            **hashes.hash_values(self),
            "expires_at": self.expires_at,
            **{f"{status}_at": t for status, t in self.stamps.items()},
            "done": self.done,
            "remaining": self.remaining,
            "tokens": self.tokens,
            "expired": self.expired,
        }

    @property
    def done(self) -> int:
        """Requests accounted for: completed + failed + cancelled. The batch settles when it reaches total."""
        return self.completed + self.failed + self.cancelled

    @property
    def finished(self) -> int:
        """Requests with a row in the results (a result or an error): done less the cancelled ones, which
        never ran."""
        return self.completed + self.failed

    @property
    def expired(self) -> int:
        """Requests that did not run because the batch's completion window ended (the cancelled ones of an
        expiring or expired batch)."""
        return self.cancelled if self.status in ("expiring", "expired") else 0

    @property
    def unfed(self) -> int:
        """Stored requests not yet made into RQ jobs."""
        return self.spooled - self.fed_requests

    @property
    def feeding(self) -> bool:
        """Chunks are left to feed and nothing stopped the feeding."""
        return self.fed < self.chunks and not self.feed_closed

    def is_due(self, now: float) -> bool:
        """Past its completion window while it still runs."""
        return self.expires_at is not None and now >= self.expires_at and self.status in ALLOWED_FROM["expiring"]

    @property
    def remaining(self) -> int:
        return max(self.total - self.done, 0)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def is_active(self) -> bool:
        return self.status not in TERMINAL

    def at(self, status: str) -> float | None:
        """When the batch last took `status` (epoch seconds); None if it never did."""
        return self.stamps.get(status)

    def age_s(self, now: float) -> float:
        return max(now - self.created_at, 0.0)

    def elapsed_s(self, now: float) -> float | None:
        """Seconds the batch has been (or was) in progress; None if it never started."""
        started = self.at("in_progress")
        if started is None:
            return None
        # Only a terminal status's own stamp ends the run: a batch resumed after completing keeps its old
        # completed_at, which is before its new in_progress_at.
        ended = self.at(self.status) if self.status in TERMINAL else None
        return max((now if ended is None else ended) - started, 0.0)

    def rates_since_start(self, now: float) -> tuple[float, float] | None:
        """(requests/s, tokens/s) over the time in progress; None before it started."""
        elapsed = self.elapsed_s(now)
        return (self.done / elapsed, self.tokens / elapsed) if elapsed else None


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(12)


def job_id(batch_id: str, custom_id: str) -> str:
    """The RQ job id of a request: fixed by batch id and custom id, so --resume can find it again."""
    return f"{batch_id}-{hashlib.blake2b(custom_id.encode(), digest_size=12).hexdigest()}"


def group_job_id(batch_id: str, chunk: int, part: int) -> str:
    """The RQ job id of part `part` of stored chunk `chunk`, a group job of up to REQUESTS_PER_JOB requests."""
    return f"{batch_id}-g{chunk}_{part}"


def registry_job_ids(conn: redis.Redis, registry_key: str, batch_id: str) -> list[str]:
    """The ids of the batch's jobs in an RQ registry of its queue (a sorted set of every batch's job ids on it)."""
    return [job.decode() for job, _ in conn.zscan_iter(registry_key, match=f"{batch_id}-*", count=1000)]


def _now() -> str:
    return f"{time.time():.3f}"


def create_batch(
    conn: redis.Redis,
    *,
    name: str,
    model: str,
    input_file: str,
    output: str,
    total: int,
    queue: str,
    priority: str = defaults.PRIORITY,
    job_timeout: int | None = None,
    task: str = "generate",
    endpoint: str = "",
    completion_window: str | None = defaults.COMPLETION_WINDOW,
    batch_id: str | None = None,
    chunks: int = 0,
    spooled: int = 0,
    requests_per_job: int | None = None,
) -> str:
    """Write a new batch record with status `validating` and index it (and its deadline, unless
    `completion_window` is None); returns the batch id (`batch_id`, or a new one). `chunks` chunk files holding
    `spooled` requests wait in storage to be fed (feed.py), `requests_per_job` to an RQ job (default
    REQUESTS_PER_JOB). A window that is no duration is a MiroError."""
    window_s = None if completion_window is None else durations.completion_window(completion_window)
    batch_id = batch_id or new_batch_id()
    created = float(_now())
    record = BatchRecord(
        id=batch_id,
        status="validating",
        created_at=created,
        name=name,
        model=model,
        input_file=input_file,
        output=output,
        queue=queue,
        priority=priority,
        job_timeout=job_timeout,
        task=task,
        endpoint=endpoint,
        completion_window=completion_window or "",
        expires_at=None if window_s is None else created + window_s,
        chunks=chunks,
        spooled=spooled,
        requests_per_job=requests_per_job or defaults.REQUESTS_PER_JOB,
        stamps={"validating": created},
    )
    pipe = conn.pipeline(transaction=True)
    pipe.hset(record.key(batch_id), mapping=record.to_hash())
    if total:
        pipe.hincrby(record.key(batch_id), "total", total)
    pipe.zadd(keys.batches(), {batch_id: created})
    if record.expires_at is not None:
        pipe.zadd(keys.batch_deadlines(), {batch_id: record.expires_at})
    if chunks:
        pipe.zadd(keys.feeding(), {batch_id: created})
    pipe.execute()
    return batch_id


def renew_window(conn: redis.Redis, batch: BatchRecord) -> float | None:
    """A batch resumed after it expired gets its window again from now; returns the new expires_at."""
    if not batch.completion_window:
        return None
    expires_at = time.time() + durations.completion_window(batch.completion_window)
    pipe = conn.pipeline(transaction=True)
    pipe.hset(keys.batch(batch.id), "expires_at", f"{expires_at:.3f}")
    pipe.zadd(keys.batch_deadlines(), {batch.id: expires_at})
    pipe.execute()
    return expires_at


def persist(conn: redis.Redis, batch_id: str) -> None:
    """Keep the batch's keys for good again (a resumed batch runs: release.py gave them a TTL when it ended)."""
    pipe = conn.pipeline(transaction=False)
    for key in keys.batch_all(batch_id):
        pipe.persist(key)
    pipe.execute()


def set_status(conn: redis.Redis, batch_id: str, status: str) -> str:
    """Move a batch to `status` (atomically, only along the lifecycle); returns the previous status.

    Setting the status a batch already has changes nothing. An unknown batch or a move the lifecycle does
    not allow (say `completed` -> `cancelling`) is a MiroError.
    """
    if status not in STATUSES:
        raise ValueError(f"unknown batch status {status!r}")
    previous, changed = scripts.SET_STATUS(
        conn, [keys.batch(batch_id)], [status, _now(), *sorted(ALLOWED_FROM[status])]
    )
    previous = previous.decode() if isinstance(previous, bytes) else previous
    if not previous:
        raise MiroError(f"There is no batch '{batch_id}' on this Redis.")
    if changed == -1:
        raise MiroError(f"Batch {batch_id} is {previous}, it cannot become {status}.")
    return previous


def get_batch(conn: redis.Redis, batch_id: str) -> BatchRecord:
    raw = conn.hgetall(BatchRecord.key(batch_id))
    if not raw:
        raise MiroError(f"There is no batch '{batch_id}' on this Redis.")
    return BatchRecord.from_hash(raw)


def statuses(conn: redis.Redis, batch_ids: list[str]) -> dict[str, str]:
    """batch id -> its status alone ("" for a batch that is gone), in one round trip."""
    with conn.pipeline(transaction=False) as pipe:
        for batch_id in batch_ids:
            pipe.hget(BatchRecord.key(batch_id), "status")
        return {b: (s or b"").decode() for b, s in zip(batch_ids, pipe.execute())}


def list_batches(conn: redis.Redis) -> list[BatchRecord]:
    """Every batch record, newest first."""
    return records(conn, [b.decode() for b in conn.zrevrange(keys.batches(), 0, -1)])


def records(conn: redis.Redis, batch_ids: list[str]) -> list[BatchRecord]:
    """The records of those batches that exist, in the order given, in one round trip."""
    pipe = conn.pipeline(transaction=False)
    for batch_id in batch_ids:
        pipe.hgetall(BatchRecord.key(batch_id))
    return [BatchRecord.from_hash(raw) for raw in pipe.execute() if raw]


def record_failed_line(conn, batch_id: str, *, custom_id: str, line: int, error: str):
    """Record an invalid line as a failed request of the batch (total and failed both +1), once per custom id.

    ``custom_id`` names the request in ``miro:batch:{id}:invalid``: the line's custom id, or ``line-N`` when
    it has none or shares one with another line. The JSON value {custom_id, line, error} becomes a failed
    row in the results. ``conn`` may be a pipeline. Returns 1 if recorded now, 0 if it already was.
    """
    record = json.dumps({"custom_id": custom_id, "line": line, "error": error})
    return scripts.RECORD_FAILED(conn, [keys.batch(batch_id), keys.batch_invalid(batch_id)], [custom_id, record])


def failed_lines(conn: redis.Redis, batch_id: str) -> dict[str, dict]:
    """custom id -> {custom_id, line, error} for every invalid line recorded for the batch."""
    return {k.decode(): json.loads(v) for k, v in conn.hgetall(keys.batch_invalid(batch_id)).items()}


def _count(
    conn,
    batch_id: str,
    counter: str,
    custom_ids: list[str],
    prompt_tokens: int = 0,
    cached_tokens: int = 0,
    completion_tokens: int = 0,
):
    """scripts.COUNT on `conn`: (added, done) from a connection; on a pipeline, queued (its result comes at execute)."""
    reply = scripts.COUNT(
        conn,
        [
            keys.batch(batch_id),
            keys.batch_counted(batch_id),
            keys.ended_batches(),
            keys.batch_deadlines(),
            keys.batch_releases(),
        ],
        [counter, prompt_tokens, cached_tokens, completion_tokens, _now(), batch_id, *custom_ids],
    )
    if isinstance(conn, redis.client.Pipeline):
        return reply
    added, done = reply
    return int(added), int(done)


def count_finished(
    conn: redis.Redis,
    batch_id: str,
    custom_id: str,
    *,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int = 0,
) -> int:
    """A request's rows are written: count it completed (and its tokens) once; returns completed+failed+cancelled."""
    return _count(conn, batch_id, "completed", [custom_id], prompt_tokens, cached_tokens, completion_tokens)[1]


def queue_count_finished(
    pipe, batch_id: str, custom_id: str, *, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
) -> None:
    """count_finished queued on a pipeline, so that many requests are counted in one round trip."""
    _count(pipe, batch_id, "completed", [custom_id], prompt_tokens, cached_tokens, completion_tokens)


def count_failed(conn: redis.Redis, batch_id: str, custom_id: str) -> int:
    """A request failed for good (its error row is written): count it once; returns completed+failed+cancelled."""
    return _count(conn, batch_id, "failed", [custom_id])[1]


def count_cancelled(conn: redis.Redis, batch_id: str, custom_ids: list[str]) -> int:
    """Requests of a cancelled batch that will not run: count each once; returns how many were newly counted.

    With no custom ids it only settles the batch: a cancelling batch with every request accounted for
    becomes cancelled.
    """
    return _count(conn, batch_id, "cancelled", custom_ids)[0]


def count_completed(
    conn: redis.Redis,
    batch_id: str,
    custom_ids: list[str],
    *,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int = 0,
) -> int:
    """Requests whose rows are written, counted completed in one COUNT with their summed tokens (which are added
    only if at least one of them is newly counted: for requests no one can have counted yet, such as the rows a
    batch reuses at submit); returns how many were newly counted."""
    return _count(conn, batch_id, "completed", custom_ids, prompt_tokens, cached_tokens, completion_tokens)[0]


def settle(conn: redis.Redis, batch_id: str) -> None:
    """Complete (or end) the batch if every request is accounted for, counting nothing: for a batch whose requests
    were all counted before it went in progress (reused rows, invalid lines)."""
    _count(conn, batch_id, "completed", [])


def uncount(conn, batch_id: str, custom_id: str, counter: str):
    """Undo the counting of a request that is queued again (``counter``: failed or cancelled); ``conn`` may be a
    pipeline."""
    return scripts.UNCOUNT(conn, [keys.batch(batch_id), keys.batch_counted(batch_id)], [counter, custom_id])
