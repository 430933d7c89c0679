"""What a BatchWorker does when requests must leave its engine without a result: a cancelled or expiring
batch's requests aborted and counted cancelled, a stopping worker's jobs put back at the front of their queues, and
the batches its counts ended released. A mixin of BatchWorker, which holds the state it reads."""

from __future__ import annotations

from rq.job import JobStatus
from rq.registry import CanceledJobRegistry

from miro.worker.fleet.records import batches, rq_private
from miro.worker.fleet.lifecycle import release

from miro.worker.process.in_flight import InFlight, RequestRun


class Cancellation:
    """The cancellation duties of BatchWorker (worker/process/batch_worker.py holds the state)."""

    def _leave_engine(self, flight: InFlight, run: RequestRun | None = None) -> None:
        """Abort a request's engine requests (all of the job's, without `run`); a job with none left running is no
        longer in flight (the caller holds held_lock)."""
        for each in [run] if run is not None else list(flight.running.values()):
            for request_id in each.request_ids:
                self.engine.abort(request_id)
                self.by_request.pop(request_id, None)
            del flight.running[each.payload.custom_id]
        if not flight.running:
            self.in_flight.pop(flight.job.id, None)

    def _requeue_in_flight(self) -> None:
        """Put unfinished jobs back at the front of their queues, in their order, for another worker (a group's
        counted requests are skipped there)."""
        with self.held_lock, self.connection.pipeline() as pipe:
            flights = list(self.in_flight.values())
            for flight in flights:
                self._leave_engine(flight)
                flight.ended = True
            for flight in reversed(flights):
                self.cleanup_execution(flight.job, pipe, flight.execution)
                rq_private.enqueue_job(flight.queue, flight.job, pipe, at_front=True)
            pipe.execute()

    def _cancel_cancelled_batches(self) -> None:
        """Read the status of every batch with requests in flight; abort those of batches being cancelled or
        expiring."""
        self.batch_statuses.refresh({flight.batch_id for flight in self.in_flight.values()})
        doomed = [flight for flight in self.in_flight.values() if self.batch_statuses.stopping(flight.batch_id)]
        if not doomed:
            return
        self._flush(force=True)  # the requests already done are counted completed, not cancelled
        cancelled = []
        with self.held_lock:
            for flight in doomed:
                cancelled.append((flight, sorted(flight.running)))
                self._leave_engine(flight)
        self._cancel(cancelled)

    def _cancel(self, flights: list[tuple[InFlight, list[str]]]) -> None:
        """Mark jobs of cancelled (or expired) batches canceled in RQ and count the given requests of each cancelled;
        no rows are written (an expired batch's come back as batch_expired errors: results.collect)."""
        with self.held_lock, self.connection.pipeline() as pipe:
            for flight, _ in flights:
                flight.ended = True
                self.in_flight.pop(flight.job.id, None)
                self.cleanup_execution(flight.job, pipe, flight.execution)
                flight.job.set_status(JobStatus.CANCELED, pipeline=pipe)
                CanceledJobRegistry(queue=flight.queue).add(flight.job, pipeline=pipe)
            pipe.execute()
        by_batch: dict[str, list[str]] = {}
        for flight, custom_ids in flights:
            by_batch.setdefault(flight.batch_id, []).extend(custom_ids)
        for batch_id, custom_ids in by_batch.items():
            batches.count_cancelled(self.connection, batch_id, custom_ids)
        self._release_ended(set(by_batch))
        self.jobs_cancelled += sum(len(custom_ids) for _, custom_ids in flights)

    def _release_ended(self, batch_ids: set[str]) -> None:
        """The batches this worker's counts may just have ended: their finished and cancelled jobs' keys go, now that
        RQ has heard of every job this worker counted (release.py)."""
        for batch_id in sorted(batch_ids):
            release.release_if_ended(self.connection, batch_id)
