"""RQ jobs for requests, written a chunk at a time by one Lua script.

The feeder (feed.py) writes a batch's stored requests as group jobs: one plain RQ job per REQUESTS_PER_JOB requests,
kwargs {"batch_id", "requests": [each request's JobPayload]}, meta batch id and `custom_ids`, id fixed by batch, chunk
and part (batches.group_job_id). RQ's bookkeeping of a job (taken, started, heartbeats, finished: about 40 Redis
commands) is then shared by the group, while each request is still counted once, by its custom id. `--resume` writes
one job per request (`write`): kwargs the request's JobPayload, meta batch id and custom id, id fixed by batch id and
custom id (batches.job_id); a request of a group that fails gets such a job too, FAILED (`record_failed`), so that
`miro retry` queues it again on its own. Jobs use the JSON serializer and function ``miro.worker.jobs.generate``.
"""

from __future__ import annotations

import zlib

from rq import Queue, Retry
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer
from rq.utils import now as rq_now

from miro.core.defaults import PRIORITY as DEFAULT_PRIORITY
from miro.worker.fleet.records import batches, keys, scripts
from miro.worker.fleet.records.payload import Request
from miro.worker.fleet.records.payload import JobPayload

JOB_FUNCTION = "miro.worker.jobs.generate"
# a finished job's hash and result expire a second after it finishes: its rows are in a part file and it is counted,
# so Redis holds the jobs in flight, not those done (a failed one stays for `miro retry`). Not 0: RQ then deletes the
# job at once, which raises for a job that an earlier, dead worker had started (rq 3.0: its execution is gone).
RESULT_TTL = 1
FAILURE_TTL = 7 * 24 * 3600
# A job whose worker died (killed, out of memory, its machine lost) while it ran this many times is quarantined:
# RQ gives up on it and each of its requests gets an error row (process/jobs.py record_given_up, GAVE_UP). A group
# run again after a death is split first, a job per request (jobs.split_suspect_group), so only the request that
# kills workers is quarantined. (A job past its timeout fails at once: its requests time out in the worker.)
QUARANTINE_AFTER = 3
ABANDONED_RETRIES = QUARANTINE_AFTER - 1  # runs again of a job whose worker died

_OWN_FIELDS = ("data", "meta", "description")


def payload(request: Request, batch_id: str, model: str, priority: str = DEFAULT_PRIORITY) -> JobPayload:
    """Everything the worker needs to run the request and write its rows."""
    return JobPayload.of(request, batch_id, model, priority)


class JobWriter:
    """Builds the RQ jobs of one batch's requests and writes them, a chunk per script."""

    def __init__(
        self,
        conn,
        queue_name: str,
        batch_id: str,
        model: str,
        priority: str,
        job_timeout: int | None,
        requests_per_job: int = 1,
    ):
        self.conn = conn
        self.requests_per_job = requests_per_job  # what `feed` puts in one job
        self.queue = Queue(queue_name, connection=conn, serializer=JSONSerializer)
        self.batch_id = batch_id
        self.model = model
        self.priority = priority
        self.job_timeout = job_timeout
        self.jobs_key = keys.batch_jobs(batch_id)

    @classmethod
    def for_batch(cls, conn, batch: batches.BatchRecord) -> JobWriter:
        return cls(conn, batch.queue, batch.id, batch.model, batch.priority, batch.job_timeout, batch.requests_per_job)

    def job(self, payload: JobPayload, enqueued_at, status: JobStatus = JobStatus.QUEUED) -> Job:
        """The request as an RQ Job built by RQ itself (status queued, enqueued now)."""
        job = self.queue.create_job(
            JOB_FUNCTION,
            kwargs=payload.to_kwargs(),
            job_id=batches.job_id(self.batch_id, payload.custom_id),
            meta={"batch_id": self.batch_id, "custom_id": payload.custom_id},
            timeout=self.job_timeout,
            result_ttl=RESULT_TTL,
            failure_ttl=FAILURE_TTL,
            description=f"{self.batch_id} {payload.custom_id[:100]}",
            status=status,
            # a job whose worker died (kill -9, lost machine) is found by RQ's maintenance once its heartbeat
            # expires and is queued again while retries remain
            retry=Retry(max=ABANDONED_RETRIES),
        )
        job.created_at = job.enqueued_at = enqueued_at
        return job

    def group_job(self, chunk: int, part: int, requests: list[Request], enqueued_at) -> Job:
        """A group job as RQ itself builds it (what group_fields and the shared fields write, field for field)."""
        job = self.queue.create_job(
            JOB_FUNCTION,
            kwargs=self.group_kwargs(requests),
            job_id=batches.group_job_id(self.batch_id, chunk, part),
            meta=self.group_meta(requests),
            timeout=self.job_timeout,
            result_ttl=RESULT_TTL,
            failure_ttl=FAILURE_TTL,
            description=self.group_description(chunk, part, requests),
            status=JobStatus.QUEUED,
            retry=Retry(max=ABANDONED_RETRIES),
        )
        job.created_at = job.enqueued_at = enqueued_at
        return job

    def shared_fields(self, request: Request, enqueued_at) -> dict:
        """The fields of the job hash RQ writes that are the same for every job of a chunk."""
        mapping = self.job(self.payload_of(request), enqueued_at).to_dict()
        for own in _OWN_FIELDS:
            del mapping[own]
        return mapping

    def payload_of(self, request: Request) -> JobPayload:
        return payload(request, self.batch_id, self.model, self.priority)

    def own_fields(self, request: Request) -> tuple[bytes, bytes, str]:
        """data, meta and description of the request's job hash, encoded as RQ's Job.to_dict encodes them."""
        return self._encoded(
            self.payload_of(request).to_kwargs(),
            {"batch_id": self.batch_id, "custom_id": request.custom_id},
            f"{self.batch_id} {request.custom_id[:100]}",
        )

    def group_fields(self, chunk: int, part: int, requests: list[Request]) -> tuple[bytes, bytes, str]:
        """data, meta and description of a group job: the requests' payloads, their custom ids."""
        return self._encoded(
            self.group_kwargs(requests), self.group_meta(requests), self.group_description(chunk, part, requests)
        )

    def group_kwargs(self, requests: list[Request]) -> dict:
        return {"batch_id": self.batch_id, "requests": [self.payload_of(r).to_kwargs() for r in requests]}

    def group_meta(self, requests: list[Request]) -> dict:
        return {"batch_id": self.batch_id, "custom_ids": [r.custom_id for r in requests]}

    def group_description(self, chunk: int, part: int, requests: list[Request]) -> str:
        return f"{self.batch_id} chunk {chunk} part {part}: {len(requests)} requests"

    @staticmethod
    def _encoded(kwargs: dict, meta: dict, description: str) -> tuple[bytes, bytes, str]:
        dumps = JSONSerializer.dumps
        return zlib.compress(dumps((JOB_FUNCTION, None, (), kwargs))), dumps(meta), description

    def _arguments(
        self, requests: list[Request], jobs: list[tuple[str, str, tuple[bytes, bytes, str]]]
    ) -> tuple[list[str], list]:
        """KEYS (the job hashes) and ARGV for the job-writing loop: `jobs` is (job id, custom id, own fields)."""
        shared = self.shared_fields(requests[0], rq_now())
        args: list = [len(shared)]
        for name, value in shared.items():
            args += (name, value)
        for jid, custom_id, own in jobs:
            args += (jid, custom_id, *own)
        return [Job.key_for(jid) for jid, _, _ in jobs], args

    def write(self, pipe, requests: list[Request]) -> None:
        """Queue on `pipe` one EVAL that writes what RQ's enqueue writes for each request (the job hash with
        status queued, the id pushed on the queue, the queue in rq:queues) and the custom id -> job id entries.

        RQ builds the first job; every job hash is that job's fields with its own data, meta and description
        (tests/worker/test_submit.py checks each stored hash equals RQ's own Job.to_dict()). One script per chunk
        sends the shared fields once instead of once per job: on 2 cores about 21,000 jobs/s, against 10,000
        for a pipeline of HSETs and 5,400 for RQ's own enqueue_many.
        """
        jobs = [(batches.job_id(self.batch_id, r.custom_id), r.custom_id, self.own_fields(r)) for r in requests]
        job_keys, args = self._arguments(requests, jobs)
        scripts.WRITE_JOBS(pipe, [self.queue.key, self.queue.redis_queues_keys, self.jobs_key, *job_keys], args)

    def feed(self, chunk: int, requests: list[Request]) -> int:
        """Write stored chunk `chunk` as group jobs of the batch's requests_per_job requests (one-request jobs if
        that is 1) if it is the batch's next one and the batch is still fed (scripts.FEED_JOBS, atomic with the
        batch's feed position); returns how many requests, or -1 if it was not."""
        size = self.requests_per_job
        if size == 1:
            jobs = [(batches.job_id(self.batch_id, r.custom_id), r.custom_id, self.own_fields(r)) for r in requests]
        else:
            jobs = [
                (batches.group_job_id(self.batch_id, chunk, part), "", self.group_fields(chunk, part, group))
                for part, group in enumerate(requests[i : i + size] for i in range(0, len(requests), size))
            ]
        job_keys, args = self._arguments(requests, jobs)
        return int(
            scripts.FEED_JOBS(
                self.conn,
                [self.queue.key, self.queue.redis_queues_keys, self.jobs_key, keys.batch(self.batch_id), *job_keys],
                [chunk, len(requests), *args],
            )
        )

    def record_failed(self, payload: JobPayload, error: str, pipe) -> None:
        """Queue on `pipe` a FAILED job of its own for a request of a group job that failed, as RQ leaves a failed
        one-request job: `miro retry` and `--resume` queue it again like any other. An existing job of the request
        (a resume has queued it again meanwhile) is left alone (the caller checks under WATCH)."""
        job = self.job(payload, rq_now(), status=JobStatus.FAILED)
        job.ended_at = rq_now()
        job.retries_left = 0
        job.save(pipeline=pipe)
        FailedJobRegistry(self.queue.name, connection=self.conn, serializer=JSONSerializer).add(
            job, ttl=FAILURE_TTL, pipeline=pipe, exc_string=error
        )
