"""`miro-submit --resume BATCH`: run again what an existing batch has not finished, reading its file once more.

A request whose job finished, or is still queued or running, is left alone; every other one (failed, cancelled,
expired from Redis, or new to the batch: an edited file, an invalid line fixed) is enqueued again, its earlier run's
keys cleared and the batch's counters kept right. A batch whose requests wait in storage (spool.py) has its
feeding opened again (feed.reopen): the requests it never fed are the feeder's, not resume's, so only the first
`fed_requests` valid requests of the file are looked at one by one; the stored copy stands for the rest.
"""

from __future__ import annotations

from typing import Iterable

from rq.job import Job, JobStatus
from rq.registry import CanceledJobRegistry, FailedJobRegistry
from rq.results import Result
from rq.serializers import JSONSerializer

from miro.worker.fleet import batches, keys, scripts
from miro.worker.fleet.inputs import Request
from miro.worker.fleet.job_writer import JobWriter

# RQ statuses under which a job will still run (or is running): --resume leaves these alone.
IN_FLIGHT = frozenset({
    JobStatus.QUEUED, JobStatus.STARTED, JobStatus.DEFERRED, JobStatus.SCHEDULED,
    JobStatus.RATE_LIMITED, JobStatus.READY_TO_ENQUEUE,
})


class Resumer:
    """Enqueues again, a chunk at a time, the requests of a batch with no job that finished or will still run."""

    def __init__(self, conn, batch: batches.BatchRecord, result):
        self.conn = conn
        self.writer = JobWriter.for_batch(conn, batch)
        self.batch_id = batch.id
        self.output = batch.output  # where the batch's part files are: which requests have rows
        self.result = result  # the SubmitResult whose counts it adds to
        self._with_rows: set[str] | None = None

    def resume_chunk(self, requests: list[Request]) -> None:
        """Enqueue the requests of the chunk that have no job that finished or will still run."""
        result, jobs_key = self.result, self.writer.jobs_key
        job_keys = [Job.key_for(batches.job_id(self.batch_id, r.custom_id)) for r in requests]
        statuses = self._released_as(requests, self._statuses(job_keys))
        candidates = [i for i, s in enumerate(statuses) if s != JobStatus.FINISHED and s not in IN_FLIGHT]
        result.already_finished += sum(s == JobStatus.FINISHED for s in statuses)
        result.in_flight += sum(s in IN_FLIGHT for s in statuses)
        if not candidates:
            return
        invalid_key = keys.batch_invalid(self.batch_id)

        def attempt(pipe) -> None:  # anything read changing before EXEC makes EXEC fail: read again
            chosen = [requests[i] for i in candidates]
            again = self._released_as(chosen, self._statuses([job_keys[i] for i in candidates]))
            reader = self.conn.pipeline(transaction=False)
            reader.hmget(jobs_key, [r.custom_id for r in chosen])
            reader.hmget(invalid_key, [r.custom_id for r in chosen])
            known, was_invalid = reader.execute()
            keep = [k for k, s in enumerate(again) if s != JobStatus.FINISHED and s not in IN_FLIGHT]
            if keep:
                pipe.multi()
                self._reset(pipe, [(chosen[k], again[k], known[k], was_invalid[k]) for k in keep])
                self.writer.write(pipe, [chosen[k] for k in keep])
                pipe.execute()
            else:
                pipe.unwatch()
            finished_now = sum(s == JobStatus.FINISHED for s in again)
            result.already_finished += finished_now
            result.in_flight += len(again) - len(keep) - finished_now
            result.expired += sum(again[k] is None and known[k] is not None for k in keep)
            result.enqueued += len(keep)

        scripts.watched(self.conn, [jobs_key, invalid_key, *(job_keys[i] for i in candidates)], attempt,
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
        reader.hmget(self.writer.jobs_key, custom_ids)
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
        queue = self.writer.queue
        failed = FailedJobRegistry(queue.name, connection=self.conn, serializer=JSONSerializer)
        canceled = CanceledJobRegistry(queue.name, connection=self.conn, serializer=JSONSerializer)
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


class UnfedFilter:
    """Tells which of a resumed file's requests the feeder still has in storage: a spooled batch's requests from the
    first one of its next chunk on that are no job yet and were no invalid line (those the file may have fixed)."""

    def __init__(self, conn, batch: batches.BatchRecord):
        from miro.worker.fleet import spool

        self.conn, self.batch_id = conn, batch.id
        self.first_line = None  # the file line from which the stored requests are not yet jobs
        if batch.chunks and batch.fed < batch.chunks:
            self.first_line = spool.read_chunk(batch.output, batch.id, batch.fed)[0].line

    def without_unfed(self, requests: list[Request]) -> list[Request]:
        if self.first_line is None:
            return requests
        late = [r.custom_id for r in requests if r.line >= self.first_line]
        if not late:
            return requests
        reader = self.conn.pipeline(transaction=False)
        reader.hmget(keys.batch_jobs(self.batch_id), late)
        reader.hmget(keys.batch_invalid(self.batch_id), late)
        jobs, invalid = reader.execute()
        unfed = {cid for cid, job, was_invalid in zip(late, jobs, invalid) if job is None and was_invalid is None}
        return [r for r in requests if r.custom_id not in unfed]
