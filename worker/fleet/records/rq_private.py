"""Every use miro makes of RQ's private API, in one file, so that an RQ upgrade that changes it breaks here,
and tests/worker/test_rq_private.py says so first.

miro's BatchWorker runs many jobs at once through one engine, which RQ's workers do not: it takes jobs,
finishes them and puts them back with RQ's own steps, some of which RQ keeps private. `miro retry` queues
failed jobs again as RQ's own retry would.

It also relies on two things RQ does not promise: BaseWorker keeps the queues it takes jobs from in
`_ordered_queues` beside `queues` (set_queues), and its bootstrap() installs no signal handlers, so that a
BatchWorker's own (or, in `miro run`, the caller's) stay in place: BatchWorker.work, not RQ's, installs them.
And, for `miro run --resume`, that a job a worker takes sits in the queue's intermediate queue until it is
started, and leaves it in the same step as its status becomes started (requeue_taken).
"""

from __future__ import annotations

from rq.job import Job
from rq.queue import Queue


def set_queues(worker, queues: list[Queue]) -> None:
    """Give a worker the queues it serves, in order (RQ's dequeue strategies read `_ordered_queues`)."""
    worker.queues = queues
    worker._ordered_queues = queues[:]


def finalize_success(worker, job: Job, queue: Queue, execution, result) -> None:
    """What RQ's worker does once a job returned: status finished, result stored, registries updated."""
    worker._finalize_success(job, queue, execution, result)


def finalize_failure(worker, job: Job, queue: Queue, execution, exc_info) -> None:
    """What RQ's worker does once a job raised: status failed, the traceback stored, registries updated."""
    worker._finalize_failure(job, queue, execution, exc_info)


def enqueue_job(queue: Queue, job: Job, pipeline, at_front: bool = False) -> None:
    """Push an existing job onto the queue (status queued, enqueued_at now) on `pipeline`."""
    queue._enqueue_job(job, pipeline, at_front=at_front)


def clear_exc_info(job: Job) -> None:
    """Forget a failed job's traceback before it runs again (RQ has no public setter)."""
    job._exc_info = ""


def requeue_taken(queue: Queue) -> None:
    """Put back at the front of the queue the jobs a worker took off it and never started (they sit in RQ's
    intermediate queue; status started and leaving it are one step, so none of them started, even if one is
    already in the started registry)."""
    for job_id in queue.intermediate_queue.get_job_ids():
        queue.intermediate_queue.remove(job_id)
        queue.push_job_id(job_id, at_front=True)
