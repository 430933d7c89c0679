"""Cancel a batch and retry its failed requests (`miro cancel`, `miro retry`).

Cancelling is shared work. `cancel` moves the batch to ``cancelling``, takes its queued jobs off the queue
(status ``canceled``, counted ``cancelled``), and hands RQ's own clean-up the jobs whose worker died, so they
come back to the queue and are taken off too. Each BatchWorker checks the status of the
batches it has requests of about once a second: it aborts those in flight and refuses new ones of a
cancelling batch. Whoever counts the last outstanding request moves the batch to ``cancelled``
(scripts.COUNT); rows already written stay. Expiry (expiry.py) is the same path with ``expiring`` and ``expired``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis
from rq import Queue
from rq.job import Job, JobStatus
from rq.registry import CanceledJobRegistry, FailedJobRegistry, StartedJobRegistry
from rq.results import Result
from rq.serializers import JSONSerializer
from rq.utils import current_timestamp

from miro.core.errors import MiroError
from miro.worker.fleet.records import batches, keys, rq_private, scripts
from miro.worker.fleet.intake import feed, routing
from miro.worker.fleet.lifecycle import release
from miro.worker.fleet.lifecycle import counted as counted_store
from miro.worker.fleet.intake.job_writer import ABANDONED_RETRIES
from miro.worker.fleet.records.payload import custom_ids_of, is_group

CHUNK = 1000
SWEEP_EVERY_S = 5.0  # while cancel waits, how often it looks for jobs put back on the queue (it reads the queue)


@dataclass
class CancelResult:
    status: str  # the batch's status when cancel returns: cancelling or cancelled
    removed: int = 0  # queued jobs taken off the queue
    running: int = 0  # requests still on workers when cancel returned
    already: bool = False  # the batch was cancelled before


def _queue(conn: redis.Redis, batch: batches.BatchRecord) -> Queue:
    return Queue(batch.queue, connection=conn, serializer=JSONSerializer)


def sweep(conn: redis.Redis, batch: batches.BatchRecord) -> int:
    """Stop feeding the batch, requeue the jobs of dead workers (RQ's clean-up), then take the batch's queued jobs
    off; returns how many.

    Taking them off the queue is one atomic script (a list rewrite: ~0.2 s per 100,000 queued jobs); marking
    them canceled runs in chunks, so Redis never stays busy long. The jobs wait in between on a list of their
    own, so a cancel that dies half-way leaves nothing behind that the next `miro cancel` does not finish.
    """
    queue, batch_id = _queue(conn, batch), batch.id
    feed.close(conn, batch_id)  # what storage still holds is counted cancelled: it is never fed
    StartedJobRegistry(queue=queue).cleanup()
    prefix = f"{batch_id}-"  # every job id of the batch starts so (batches.job_id)
    removed = int(scripts.TAKE_OFF_QUEUE(conn, [queue.key, keys.batch_cancel_pending(batch_id)], [prefix]))
    canceled = CanceledJobRegistry(queue=queue)
    pending = [keys.batch_cancel_pending(batch_id), canceled.key, keys.batch(batch_id), keys.batch_counted(batch_id)]
    while scripts.CANCEL_PENDING(conn, pending, [CHUNK, current_timestamp(), Job.redis_job_namespace_prefix]):
        pass
    # requests RQ failed itself after their workers died too often: nobody will run them now
    given_up = [
        custom_id
        for job, custom_ids in uncounted_failures(conn, queue)
        if job.meta["batch_id"] == batch_id
        for custom_id in custom_ids
    ]
    batches.count_cancelled(conn, batch_id, given_up)  # and settle the batch once nothing is outstanding
    release.release_if_ended(conn, batch_id)  # settled: its jobs' keys go
    return removed


def outstanding(conn: redis.Redis, batch_id: str) -> int:
    """Requests of the batch not yet accounted for; after a sweep, those that workers still hold."""
    return batches.get_batch(conn, batch_id).remaining


def cancel(conn: redis.Redis, batch_id: str, wait_s: float = 0.0) -> CancelResult:
    """Cancel the batch; wait up to `wait_s` for the workers to abort its requests in flight."""
    batch = batches.get_batch(conn, batch_id)
    if batch.status == "cancelled":
        return CancelResult(status="cancelled", already=True)
    if batch.status in ("completed", "failed", "expiring", "expired"):
        raise MiroError(f"Batch {batch_id} is {batch.status}; there is nothing left to cancel.")
    batches.set_status(conn, batch_id, "cancelling")
    result = CancelResult(status="cancelling", removed=sweep(conn, batch))
    deadline = time.monotonic() + wait_s
    last_sweep = time.monotonic()
    while True:
        result.status = batches.get_batch(conn, batch_id).status
        if result.status == "cancelled" or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
        if time.monotonic() - last_sweep >= SWEEP_EVERY_S:  # jobs requeued since: a worker died or got SIGTERM
            result.removed += sweep(conn, batch)
            last_sweep = time.monotonic()
    result.running = 0 if result.status == "cancelled" else outstanding(conn, batch_id)
    return result


@dataclass
class RetryResult:
    enqueued: int = 0  # failed requests queued again
    invalid: int = 0  # failed requests that were invalid lines: there is nothing to run


def _failed_jobs(conn: redis.Redis, batch: batches.BatchRecord) -> list[tuple[str, str]]:
    """(custom id, job id) of every request of the batch whose job is FAILED in RQ: the jobs of its queue's failed
    registry whose ids are the batch's (batches.job_id), so this takes the failures' time, not the batch's."""
    ids = batches.registry_job_ids(conn, FailedJobRegistry(queue=_queue(conn, batch)).key, batch.id)
    failed = []
    for start in range(0, len(ids), CHUNK):
        jobs = Job.fetch_many(ids[start : start + CHUNK], connection=conn, serializer=JSONSerializer)
        failed += [
            (job.meta["custom_id"], job.id)
            for job in jobs  # a group's failed requests have jobs of their own
            if job is not None and not is_group(job.meta) and job.get_status(refresh=False) == JobStatus.FAILED
        ]
    return failed


def retry(conn: redis.Redis, batch_id: str) -> RetryResult:
    """Queue every failed request of the batch again (with fresh retries); its new run replaces its error row."""
    batch = batches.get_batch(conn, batch_id)
    if batch.status in batches.STOPPING:
        raise MiroError(
            f"Batch {batch_id} is {batch.status}; to run what it has left, submit its file again "
            f"with --resume {batch_id}."
        )
    if batch.status == "validating":
        raise MiroError(f"Batch {batch_id} is still being submitted; retry it once it is in progress.")
    result = RetryResult(invalid=conn.hlen(keys.batch_invalid(batch_id)))
    failed = _failed_jobs(conn, batch)
    if not failed:
        return result
    counted_store.restore(conn, batch)  # an ended batch's counted set, from storage (counted.py)
    batches.set_status(conn, batch_id, "in_progress")
    registry = FailedJobRegistry(queue=_queue(conn, batch))  # where they failed, under the queue recorded then
    batch.queue = routing.upgrade_recorded_queue(conn, batch_id, batch.queue, batch.priority)
    queue = _queue(conn, batch)
    for start in range(0, len(failed), CHUNK):
        result.enqueued += _requeue(conn, queue, registry, batch_id, failed[start : start + CHUNK])
    return result


def _requeue(
    conn: redis.Redis, queue: Queue, registry: FailedJobRegistry, batch_id: str, chunk: list[tuple[str, str]]
) -> int:
    """Queue the chunk's jobs that are still FAILED, each with its counters, in one transaction."""

    def attempt(pipe) -> int:  # another retry or resume of the same jobs makes EXEC fail: read again
        jobs = Job.fetch_many([jid for _, jid in chunk], connection=conn, serializer=JSONSerializer)
        todo = [
            (cid, job)
            for (cid, _), job in zip(chunk, jobs)
            if job is not None and job.get_status(refresh=False) == JobStatus.FAILED
        ]
        pipe.multi()
        for cid, job in todo:
            registry.remove(job, pipeline=pipe)
            pipe.delete(Result.get_key(job.id))
            job.retries_left = ABANDONED_RETRIES
            job.started_at = job.ended_at = None
            rq_private.clear_exc_info(job)
            rq_private.enqueue_job(queue, job, pipe)
            batches.uncount(pipe, batch_id, cid, "failed")
        pipe.execute()
        return len(todo)

    return scripts.watched(conn, [Job.key_for(jid) for _, jid in chunk], attempt, f"Batch {batch_id}")


def uncounted_failures(conn: redis.Redis, queue: Queue) -> list[tuple[Job, list[str]]]:
    """Jobs of the queue's failed registry with requests no batch counted, and those requests' custom ids: RQ's
    clean-up failed them itself after their workers died too often. Every other failed request is counted (with its
    error row) before its job fails."""
    ids = FailedJobRegistry(queue=queue).get_job_ids(cleanup=False)
    failed = [
        (job, custom_ids_of(job.meta))
        for job in Job.fetch_many(ids, connection=conn, serializer=queue.serializer)
        if job is not None and "batch_id" in job.meta and ("custom_id" in job.meta or is_group(job.meta))
    ]
    with conn.pipeline(transaction=False) as pipe:
        for job, custom_ids in failed:
            counted_store.queue_were_counted(pipe, job.meta["batch_id"], custom_ids)
        replies = pipe.execute()
    counted = [counted_store.from_replies(*replies[i : i + 2]) for i in range(0, len(replies), 2)]
    uncounted = [
        (job, [c for c, seen in zip(custom_ids, flags) if not seen])
        for (job, custom_ids), flags in zip(failed, counted)
    ]
    return [(job, custom_ids) for job, custom_ids in uncounted if custom_ids]


def requeue_abandoned(conn: redis.Redis, queue_name: str) -> None:
    """Every job taken from the queue goes back on it (`miro run --resume`: a run killed outright, by SIGKILL or
    a power cut, left them taken). Only for a queue that no worker serves now: each job taken counts as
    abandoned."""
    queue = Queue(queue_name, connection=conn, serializer=JSONSerializer)
    rq_private.requeue_taken(queue)
    StartedJobRegistry(queue=queue).cleanup(timestamp=time.time() + 10**9)  # as if their heartbeats had lapsed
