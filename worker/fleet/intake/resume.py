"""`miro-submit --resume BATCH`: run again what an existing batch has not finished, reading its file once more.

A request whose job finished, or is still queued or running, is left alone; every other one (failed, cancelled,
expired from Redis, or new to the batch: an edited file, an invalid line fixed) is enqueued again, its earlier run's
keys cleared and the batch's counters kept right. A batch whose requests wait in storage (spool.py) has its
feeding opened again (feed.reopen): the requests it never fed are the feeder's, not resume's (the stored copy stands
for them), and which are which is told by the stored chunks (StoredIndex), as Redis keeps no index of a fed batch's
requests: a request is the batch's if it is counted, has a job hash, or sits in a chunk the batch fed.
"""

from __future__ import annotations

import bisect
from typing import Iterable

from rq.job import Job, JobStatus
from rq.registry import CanceledJobRegistry, FailedJobRegistry
from rq.results import Result
from rq.serializers import JSONSerializer

from miro.worker.fleet.records import batches, keys, scripts
from miro.worker.fleet.lifecycle import counted
from miro.worker.fleet.records.payload import Request
from miro.worker.fleet.intake.job_writer import JobWriter

# RQ statuses under which a job will still run (or is running): --resume leaves these alone.
IN_FLIGHT = frozenset(
    {
        JobStatus.QUEUED,
        JobStatus.STARTED,
        JobStatus.DEFERRED,
        JobStatus.SCHEDULED,
        JobStatus.RATE_LIMITED,
        JobStatus.READY_TO_ENQUEUE,
    }
)


def known_requests(conn, batch_id: str, custom_ids: list[str]) -> list[bool]:
    """Which of these custom ids are requests the batch has made into jobs: in its jobs hash (what --resume and
    batches from before stored requests enqueued), counted, or with a job hash (a fed request that is neither yet)."""
    reader = conn.pipeline(transaction=False)
    reader.hmget(keys.batch_jobs(batch_id), custom_ids)
    reader.smismember(keys.batch_counted(batch_id), custom_ids)
    for custom_id in custom_ids:
        reader.exists(Job.key_for(batches.job_id(batch_id, custom_id)))
    indexed, counted, *has_job = reader.execute()
    return [
        job is not None or bool(was_counted) or bool(exists)
        for job, was_counted, exists in zip(indexed, counted, has_job)
    ]


class Resumer:
    """Enqueues again, a chunk at a time, the requests of a batch with no job that finished or will still run."""

    def __init__(self, conn, batch: batches.BatchRecord, result):
        self.conn = conn
        counted.restore(conn, batch)  # an ended batch's counted set, from storage (counted.py)
        self.stored = StoredIndex(batch)
        self.writer = JobWriter.for_batch(conn, batch)
        self.batch_id = batch.id
        self.output = batch.output  # where the batch's part files are: which requests have rows
        self.result = result  # the SubmitResult whose counts it adds to
        self._with_rows: set[str] | None = None

    def resume_chunk(self, requests: list[Request]) -> None:
        """Enqueue the requests of the chunk that have no job that finished or will still run; those the feeder
        has still to feed are left to it."""
        unfed = self.stored.unfed(requests)
        requests = [r for r in requests if r.custom_id not in unfed]
        if not requests:
            return
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
            indexed = known_requests(self.conn, self.batch_id, [r.custom_id for r in chosen])
            known = [is_known or self.stored.fed(r.custom_id) for r, is_known in zip(chosen, indexed)]
            was_invalid = self.conn.hmget(invalid_key, [r.custom_id for r in chosen])
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
            result.expired += sum(again[k] is None and known[k] for k in keep)
            result.enqueued += len(keep)

        watch = [jobs_key, invalid_key, keys.batch_counted(self.batch_id), *(job_keys[i] for i in candidates)]
        scripts.watched(self.conn, watch, attempt, f"Batch {self.batch_id}")

    def _statuses(self, job_keys: list[str]) -> list[JobStatus | None]:
        reader = self.conn.pipeline(transaction=False)
        for key in job_keys:
            reader.hget(key, "status")
        return [JobStatus(s.decode()) if s else None for s in reader.execute()]

    def _released_as(self, requests: list[Request], statuses: list[JobStatus | None]) -> list[JobStatus | None]:
        """What the requests with no job hash of their own were: a finished job's expires a second after it finished
        (job_writer.RESULT_TTL), an ended batch's cancelled ones went (release.py), so a request that was counted
        is finished if the part files have a row of it, and was cancelled if not. One that was not counted still
        runs if the group job the feeder wrote it in is queued or running (it takes that job's status)."""
        gone = [i for i, status in enumerate(statuses) if status is None]
        if not gone:
            return statuses
        custom_ids = [requests[i].custom_id for i in gone]
        counted = self.conn.smismember(keys.batch_counted(self.batch_id), custom_ids)
        out = list(statuses)
        for i, custom_id, was_counted in zip(gone, custom_ids, counted):
            if was_counted:
                out[i] = JobStatus.FINISHED if custom_id in self.with_rows() else JobStatus.CANCELED
        groups = {
            i: group
            for i, was_counted in zip(gone, counted)
            if not was_counted and (group := self.stored.group_job(requests[i].custom_id)) is not None
        }
        for i, status in zip(groups, self._statuses([Job.key_for(g) for g in groups.values()])):
            if status in IN_FLIGHT:
                out[i] = status
        return out

    def with_rows(self) -> set[str]:
        """The custom ids with a row in the batch's part files (read once per submit)."""
        if self._with_rows is None:
            from miro.worker.fleet.output.results import read_parts  # pyarrow: only a resume of an ended batch needs it

            self._with_rows = set(read_parts(self.output, self.batch_id).column("custom_id").to_pylist())
        return self._with_rows

    def _reset(self, pipe, rows: Iterable[tuple[Request, JobStatus | None, bool, bytes | None]]) -> None:
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
            if not known:  # a request new to the batch (or one that was an invalid line before)
                pipe.hincrby(batch_key, "total", 1)
                if was_invalid is not None:
                    pipe.hdel(keys.batch_invalid(self.batch_id), request.custom_id)
                    pipe.hincrby(batch_key, "total", -1)
                    pipe.hincrby(batch_key, "failed", -1)


class StoredIndex:
    """Custom id -> where the batch's storage holds it (stored chunk, place in it), for a batch whose requests wait
    in storage (spool.py): read once, when first asked, 12 bytes an id (seen_ids.SeenIds keeps each id's ordinal in
    the storage). A resume needs it to tell what the batch fed from what it has not, both from a line new to the
    file, and which group job the feeder wrote a request in."""

    def __init__(self, batch: batches.BatchRecord):
        self.batch = batch
        self._ordinals = None
        self._starts: list[int] = []  # the ordinal of each chunk's first request

    def place_of(self, custom_id: str) -> tuple[int, int] | None:
        """(chunk, index in it) of a stored request; None if the storage has no such request."""
        if not self.batch.chunks:
            return None
        if self._ordinals is None:
            from miro.worker.fleet.intake import spool
            from miro.worker.fleet.intake.seen_ids import SeenIds

            self._ordinals, start = SeenIds(int(self.batch.spooled * 1.1)), 0
            for index in range(self.batch.chunks):
                ids = [r.custom_id for r in spool.read_chunk(self.batch.output, self.batch.id, index)]
                self._starts.append(start)
                self._ordinals.add(ids, list(range(start, start + len(ids))))
                start += len(ids)
        ordinal = self._ordinals.first_line(custom_id, 0, record=False)
        if ordinal is None:
            return None
        chunk = bisect.bisect_right(self._starts, ordinal) - 1
        return chunk, ordinal - self._starts[chunk]

    def chunk_of(self, custom_id: str) -> int | None:
        place = self.place_of(custom_id)
        return None if place is None else place[0]

    def group_job(self, custom_id: str) -> str | None:
        """The id of the group job the feeder wrote the request in (job_writer.JobWriter.feed), if it fed it."""
        place = self.place_of(custom_id) if self.batch.requests_per_job > 1 else None
        if place is None or place[0] >= self.batch.fed:
            return None
        return batches.group_job_id(self.batch.id, place[0], place[1] // self.batch.requests_per_job)

    def fed(self, custom_id: str) -> bool:
        """A stored request that the batch has made into a job."""
        chunk = self.chunk_of(custom_id)
        return chunk is not None and chunk < self.batch.fed

    def unfed(self, requests: list[Request]) -> set[str]:
        """The custom ids of those requests that the feeder still has to make into jobs."""
        if self.batch.fed >= self.batch.chunks:
            return set()
        return {
            r.custom_id
            for r in requests
            if (chunk := self.chunk_of(r.custom_id)) is not None and chunk >= self.batch.fed
        }
