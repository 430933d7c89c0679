"""What a BatchWorker does when a request, a job or its engine fails: the request's error row and count, the
job failed in RQ (or a group's request given a failed job of its own), timeouts enforced per request, and an engine
that failed in a step started afresh. A mixin of BatchWorker, which holds the state it reads."""

from __future__ import annotations

import sys
import time

from rq.job import Job
from rq.queue import Queue

from miro.core import Engine, MiroError

from miro.worker.fleet.records import rq_private
from miro.worker.fleet.records.payload import JobPayload

from miro.worker.process.in_flight import InFlight
from miro.worker.process.jobs import record_failure, record_group_failure
from miro.worker.process.worker_support import describe


ENGINE_FAILED = (
    "the engine failed in a step this request was part of, not on this request alone ({}); the worker "
    "failed the requests it had in flight and started its engine afresh"
)


class FailureHandling:
    """The failure duties of BatchWorker (worker/process/batch_worker.py holds the state: in_flight, engine, sinks)."""

    def _engine_failed(self, exc: Exception) -> None:
        """Engine.step() raised an error no request accounts for (a request's own faults end that request inside the
        step): every request in flight fails once, with an error row saying so, and the engine starts afresh
        (Engine.reset; rebuilt from the model file if that fails too). The worker goes on."""
        what = describe(exc)
        with self.held_lock:
            runs = [(flight, run) for flight in self.in_flight.values() for run in flight.running.values()]
        self.log.error(
            "Worker %s: the engine failed in a step (%s): failing the %d requests in flight and starting "
            "the engine afresh",
            self.name,
            what,
            len(runs),
        )
        try:
            self.engine.reset()
        except Exception as again:  # noqa: BLE001 - then a new engine from the model file
            self.log.error(
                "Worker %s: resetting the engine failed too (%s): loading %s again",
                self.name,
                describe(again),
                self.model,
            )
            self.engine = Engine.from_model(self.model, **self.engine_options)
        self.by_request.clear()
        for flight, run in runs:
            with self.held_lock:
                flight.running.pop(run.payload.custom_id, None)
                if not flight.running and not flight.group:
                    self.in_flight.pop(flight.job.id, None)
            self.errors.guard(
                "failing a request",
                self._fail_request,
                flight,
                run.payload,
                ENGINE_FAILED.format(what),
                run.started,
                prompt=run.prompt,
                model=self.model_name,
            )
        with self.held_lock:
            for flight in [f for f in self.in_flight.values() if not f.running]:
                self.in_flight.pop(flight.job.id, None)

    def _fail(self, job: Job, queue: Queue, execution, message: str) -> None:
        self.jobs_failed += 1
        job.retries_left = 0  # the retries are for dead workers; the request itself would fail again
        try:
            raise MiroError(message) from None  # raised here only to hand RQ an exc_info; no chained context
        except MiroError:
            with self.held_lock:
                rq_private.finalize_failure(self, job, queue, execution, sys.exc_info())

    def handle_exception(self, job: Job, *exc_info):
        """A request miro failed on purpose (refused by the engine, timed out, for another model) is one log
        line, not a traceback: it is the request's problem, said in its error row, not the worker's."""
        if isinstance(exc_info[1], MiroError):
            self.log.warning(
                "Worker %s: request %s failed: %s", self.name, job.meta.get("custom_id", job.id), exc_info[1]
            )
            return
        super().handle_exception(job, *exc_info)

    def _fail_request(
        self,
        flight: InFlight,
        payload: JobPayload,
        message: str,
        started: float,
        *,
        prompt: str | None = None,
        model: str | None = None,
    ) -> None:
        """A request that cannot (or may no longer) run: its error row is written and counted. A one-request job then
        fails; a group's request gets a failed job of its own and the group goes on."""
        sink = self._sink(flight.batch_id)
        if flight.group:  # the job goes on, so RQ's handle_exception will not say it: said here
            self.jobs_failed += 1
            self.log.warning("Worker %s: request %s failed: %s", self.name, payload.custom_id, message)
            record_group_failure(
                self.connection,
                sink,
                flight.job.id,
                payload,
                message,
                worker=self.name,
                started=started,
                prompt=prompt,
                model=model,
            )
            flight.unsettled.discard(payload.custom_id)
            with self.held_lock:
                self._settle(flight)
        else:
            record_failure(
                self.connection,
                sink,
                flight.job.id,
                payload,
                message,
                worker=self.name,
                started=started,
                prompt=prompt,
                model=model,
            )
            flight.unsettled.discard(payload.custom_id)
            flight.ended = True
            with self.held_lock:
                self.in_flight.pop(flight.job.id, None)
            self._fail(flight.job, flight.queue, flight.execution, message)
        self._release_ended({flight.batch_id})

    def _enforce_timeouts(self) -> None:
        """RQ's job timeout, enforced per request here since there is no work-horse process to kill: a request past
        it leaves the engine and fails with an error row, and the requests beside it go on."""
        now_s = time.time()
        for flight in list(self.in_flight.values()):
            timeout = flight.job.timeout
            if timeout is None or timeout <= 0:
                continue
            for run in [r for r in flight.running.values() if now_s - r.started > timeout]:
                with self.held_lock:
                    self._leave_engine(flight, run)
                self._fail_request(
                    flight,
                    run.payload,
                    f"timed out after {timeout} s",
                    run.started,
                    prompt=run.prompt,
                    model=self.model_name,
                )
