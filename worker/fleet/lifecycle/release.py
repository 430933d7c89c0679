"""What Redis keeps of a batch once it has ended: its record, its counters and miro's per-request index, not RQ's
jobs.

Every request is an RQ job; a finished one's hash and result expire a second after it finished (job_writer.RESULT_TTL)
and RQ keeps a canceled one's hash for ever. Once a batch has ended (completed, cancelled, expired), the job hashes, result streams and registry
entries of its finished and cancelled requests go (scripts.RELEASE_JOBS, RELEASE_CHUNK jobs per call, UNLINKed).
What stays:

- the batch record (`miro:batch:{id}`: status, counters, token sums): `miro status`, the API's batch objects;
- which requests were counted, so a request that runs twice still counts once, and `--resume` knows what to run
  again (a request counted but with no row in the part files is one that was cancelled: resume.py): the release
  moves the `:counted` set to storage beside the part files, `_counted.jsonl` (counted.py), so Redis keeps no byte
  a request; `--resume` and `miro retry` bring it back;
  `miro:batch:{id}:jobs` (custom id -> job id) for the jobs --resume enqueued and batches from before requests were
  stored; the stored chunks list the rest (spool.py), which `miro results` and the Anthropic results read for the
  requests that never ran;
- `:invalid` (the invalid lines' error rows);
- the jobs of failed requests, until RQ's failure_ttl: `miro retry` queues those very jobs again.

The count that ends a batch puts it in `miro:batch-releases` (scripts.COUNT); whoever ended it releases it at once,
once the jobs it holds are finished in RQ (the worker that counted the last request, `miro cancel`, the expiry
sweep), and every worker and `miro serve` release, about once a second, any batch that ended more than
RELEASE_GRACE_S ago and is still there: one whose releaser died half-way, or that RQ's own SimpleWorker ended.
Releasing twice, or at once from two processes, deletes nothing twice.

What stays is kept for BATCH_TTL_S (30 days) after the batch ended: the release gives the record and its
per-request keys that TTL (scripts.EXPIRE_ENDED, only if the batch has still ended), so Redis ends up where it was
before the batch; `--resume` makes them persist again (batches.persist).
"""

from __future__ import annotations

import time
from typing import Iterator

import redis
from rq.job import Job
from rq.registry import CanceledJobRegistry, FinishedJobRegistry
from rq.results import Result

from miro.core import defaults

from miro.core.errors import MiroError

from miro.worker.fleet.records import batches, keys, scripts
from miro.worker.fleet.lifecycle import counted

_PREFIXES = (
    Job.redis_job_namespace_prefix,
    Result.get_key(""),
    FinishedJobRegistry.key_template.format(""),
    CanceledJobRegistry.key_template.format(""),
)
STALE_PER_CALL = 4  # batches release_stale looks at per call; the rest wait for the next one


def _job_ids(conn: redis.Redis, batch_id: str, queue: str, chunk: int) -> Iterator[list[str]]:
    """The batch's job ids that may still have keys, a chunk at a time: those of its jobs hash (what --resume and
    batches from before stored requests enqueued) and those in its queue's canceled and finished registries (a fed
    job is in no hash; a finished one's hash expires by itself, a canceled one's stays)."""
    cursor = 0
    while True:
        cursor, jobs = conn.hscan(keys.batch_jobs(batch_id), cursor, count=chunk)
        if jobs:
            yield [job.decode() for job in jobs.values()]
        if cursor == 0:
            break
    for registry in (CanceledJobRegistry, FinishedJobRegistry):
        ids = batches.registry_job_ids(conn, registry.key_template.format(queue), batch_id) if queue else []
        for start in range(0, len(ids), chunk):
            yield ids[start : start + chunk]


def _forget_expired(conn: redis.Redis, finished_registry: str, jobs: list[str]) -> None:
    """Take the jobs whose hash has expired (a finished one's, a second after it finished) out of the batch's queue's
    finished registry, which RQ would do only at its next clean-up."""
    reader = conn.pipeline(transaction=False)
    for job in jobs:
        reader.exists(Job.key_for(job))
    gone = [job for job, exists in zip(jobs, reader.execute()) if not exists]
    if gone:
        conn.zrem(finished_registry, *gone)


def release(conn: redis.Redis, batch_id: str, chunk: int = defaults.RELEASE_CHUNK) -> int:
    """Delete the RQ keys of the batch's finished and cancelled jobs; returns how many jobs went."""
    began = conn.zscore(keys.batch_releases(), batch_id)
    queue = (conn.hget(keys.batch(batch_id), "queue") or b"").decode()
    released = 0
    for jobs in _job_ids(conn, batch_id, queue, chunk):
        released += int(scripts.RELEASE_JOBS(conn, [], [*_PREFIXES, *jobs]))
        _forget_expired(conn, FinishedJobRegistry.key_template.format(queue), jobs)
    if began is not None:
        try:
            counted.store(conn, batches.get_batch(conn, batch_id))  # its counted set goes to storage (counted.py)
        except MiroError:  # the record is gone
            pass
        scripts.EXPIRE_ENDED(conn, keys.batch_all(batch_id), [defaults.BATCH_TTL_S, *sorted(batches.TERMINAL)])
        scripts.FORGET_RELEASE(conn, [keys.batch_releases()], [batch_id, repr(began)])
    return released


def release_if_ended(conn: redis.Redis, batch_id: str) -> int:
    """Release the batch if it has ended and is not released yet (the caller has just counted some of it)."""
    if conn.zscore(keys.batch_releases(), batch_id) is None:
        return 0
    return release(conn, batch_id)


def release_stale(conn: redis.Redis, now: float | None = None, grace_s: float = defaults.RELEASE_GRACE_S) -> list[str]:
    """Release the batches that ended more than grace_s ago and are still waiting (up to STALE_PER_CALL)."""
    now = time.time() if now is None else now
    stale = [
        b.decode()
        for b in conn.zrangebyscore(keys.batch_releases(), "-inf", now - grace_s, start=0, num=STALE_PER_CALL)
    ]
    for batch_id in stale:
        release(conn, batch_id)
    return stale
