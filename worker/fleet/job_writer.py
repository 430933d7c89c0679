"""RQ jobs for requests: one plain RQ job per request, written a chunk at a time by one Lua script.

Jobs use the JSON serializer, function ``miro.worker.jobs.generate``, kwargs = the request's JobPayload and meta =
batch id and custom id, with ids fixed by batch id and custom id (batches.job_id). Both the first window that
`miro-submit` enqueues and every later one the feeder (feed.py) enqueues go through `JobWriter.write`.
"""

from __future__ import annotations

import zlib

from rq import Queue, Retry
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer
from rq.utils import now as rq_now

from miro.core.defaults import PRIORITY as DEFAULT_PRIORITY
from miro.worker.fleet import batches, keys, scripts
from miro.worker.fleet.inputs import Request
from miro.worker.fleet.payload import JobPayload

JOB_FUNCTION = "miro.worker.jobs.generate"
# a finished job's hash and result expire a second after it finishes: its rows are in a part file and it is counted,
# so Redis holds the jobs in flight, not those done (a failed one stays for `miro retry`). Not 0: RQ then deletes the
# job at once, which raises for a job that an earlier, dead worker had started (rq 3.0: its execution is gone).
RESULT_TTL = 1
FAILURE_TTL = 7 * 24 * 3600
ABANDONED_RETRIES = 3  # runs again of a job whose worker died

_OWN_FIELDS = ("data", "meta", "description")


def payload(request: Request, batch_id: str, model: str, priority: str = DEFAULT_PRIORITY) -> JobPayload:
    """Everything the worker needs to run the request and write its rows."""
    return JobPayload(batch_id=batch_id, custom_id=request.custom_id, kind=request.kind, model=model,
                      priority=priority,
                      sampling=request.sampling, prompt=request.prompt if request.kind == "completion" else None,
                      messages=request.messages if request.kind in ("chat", "response") else None,
                      inputs=request.inputs, pooling=request.pooling, encoding_format=request.encoding_format,
                      response=request.response,
                      requested_model=request.model, line=request.line, extra=request.extra)


class JobWriter:
    """Builds the RQ jobs of one batch's requests and writes them, a chunk per script."""

    def __init__(self, conn, queue_name: str, batch_id: str, model: str, priority: str, job_timeout: int | None):
        self.conn = conn
        self.queue = Queue(queue_name, connection=conn, serializer=JSONSerializer)
        self.batch_id = batch_id
        self.model = model
        self.priority = priority
        self.job_timeout = job_timeout
        self.jobs_key = keys.batch_jobs(batch_id)

    @classmethod
    def for_batch(cls, conn, batch: batches.BatchRecord) -> JobWriter:
        return cls(conn, batch.queue, batch.id, batch.model, batch.priority, batch.job_timeout)

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

    def _arguments(self, requests: list[Request]) -> tuple[list[str], list]:
        shared = self.shared_fields(requests[0], rq_now())
        ids = [batches.job_id(self.batch_id, r.custom_id) for r in requests]
        args: list = [len(shared)]
        for name, value in shared.items():
            args += (name, value)
        for request, jid in zip(requests, ids):
            args += (jid, request.custom_id, *self.own_fields(request))
        return [Job.key_for(jid) for jid in ids], args

    def write(self, pipe, requests: list[Request]) -> None:
        """Queue on `pipe` one EVAL that writes what RQ's enqueue writes for each request (the job hash with
        status queued, the id pushed on the queue, the queue in rq:queues) and the custom id -> job id entries.

        RQ builds the first job; every job hash is that job's fields with its own data, meta and description
        (tests/worker/test_submit.py checks each stored hash equals RQ's own Job.to_dict()). One script per chunk
        sends the shared fields once instead of once per job: on 2 cores about 21,000 jobs/s, against 10,000
        for a pipeline of HSETs and 5,400 for RQ's own enqueue_many.
        """
        job_keys, args = self._arguments(requests)
        scripts.WRITE_JOBS(pipe, [self.queue.key, self.queue.redis_queues_keys, self.jobs_key, *job_keys], args)

    def feed(self, chunk: int, requests: list[Request]) -> int:
        """Write the jobs of stored chunk `chunk` if it is the batch's next one and the batch is still fed
        (scripts.FEED_JOBS, atomic with the batch's feed position); returns how many, or -1 if it was not."""
        job_keys, args = self._arguments(requests)
        return int(scripts.FEED_JOBS(self.conn, [self.queue.key, self.queue.redis_queues_keys, self.jobs_key,
                                                 keys.batch(self.batch_id), *job_keys], [chunk, *args]))
