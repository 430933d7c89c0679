"""Taking a job off a worker's queues, and finding it again when Redis went away in the middle of the take.

TAKE_NEXT_JOB moves the job onto its queue's intermediate list and writes "{queue key} {job id}" to the worker's
last-take key in one step. If Redis dies before the reply arrives, or before the job's hash is read, the worker
holds nothing, yet the job is off the queue: a burst worker would end without it, and RQ's maintenance would only
queue it again minutes later. After an outage the worker reads its last take: a job still on that intermediate
list (not started: starting takes it off) is the one it lost, and it starts it.
"""

from __future__ import annotations

from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.queue import Queue
from rq.utils import as_text

from miro.core import defaults
from miro.worker.fleet.records import keys, scripts


def take_next(worker, queues: list[Queue]) -> tuple[Job, Queue] | None:
    """The job at the head of the most urgent of `queues` with one, and its queue; None if all are empty."""
    by_key = {queue.key: queue for queue in queues}
    script_keys = [
        keys.worker_last_take(worker.name),
        *(key for queue in queues for key in (queue.key, queue.intermediate_queue_key)),
    ]
    while taken := scripts.TAKE_NEXT_JOB(worker.connection, script_keys, [defaults.LAST_TAKE_TTL_S]):
        queue = by_key[as_text(taken[0])]
        job = _fetch(worker, queue, as_text(taken[1]))
        if job is not None:
            return job, queue
    return None


def lost_take(worker) -> tuple[Job, Queue] | None:
    """The job this worker took just before Redis went away and never started, if there is one."""
    last = worker.connection.get(keys.worker_last_take(worker.name))
    if last is None:
        return None
    queue_key, job_id = as_text(last).split(" ", 1)
    queue = next((q for q in worker.queues if q.key == queue_key), None)
    if queue is None or worker.connection.lpos(queue.intermediate_queue_key, job_id) is None:
        return None  # started (in flight or finished: starting takes it off the list), or queued again by RQ
    job = _fetch(worker, queue, job_id)
    return (job, queue) if job is not None else None


def _fetch(worker, queue: Queue, job_id: str) -> Job | None:
    try:
        return worker.job_class.fetch(job_id, connection=worker.connection, serializer=worker.serializer)
    except NoSuchJobError:  # deleted while queued (its result TTL, `miro delete`): nothing to run
        queue.intermediate_queue.remove(job_id)
        return None
