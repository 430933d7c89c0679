"""What a BatchWorker does with the requests its engine finished: their rows to the batch's Parquet sink, counted
only once a part file has made them durable, and a job finished in RQ only once every one of its requests is counted
(so a crash can repeat a request, never lose it). A mixin of BatchWorker, which holds the state it reads."""

from __future__ import annotations

import time

from miro.worker.fleet.output.sink import ParquetSink
from miro.worker.fleet.records import batches, rq_private

from miro.worker.process.in_flight import InFlight, RequestRun
from miro.worker.process.jobs import TokenCounts, count_finished, job_rows, output_error
from miro.worker.process.worker_support import describe


class Delivery:
    """The output duties of BatchWorker (worker/process/batch_worker.py holds the state)."""

    def _sink(self, batch_id: str) -> ParquetSink:
        if batch_id not in self.outputs:  # read each batch's output location once, not once per request
            self.outputs[batch_id] = batches.get_batch(self.connection, batch_id).output
        output = self.outputs[batch_id]
        if output not in self.sinks:
            self.sinks[output] = ParquetSink(output, self.name, self.flush_rows, self.flush_seconds)
        return self.sinks[output]

    def _finish(self, flight: InFlight, run: RequestRun) -> None:
        """A request's rows go to its sink; it is counted, and its job settled, once they are written. One the engine
        ended with an error (its own fault in a step), or whose rows cannot be made, fails with an error row."""
        outputs = run.finished_outputs()
        error = output_error(run.payload, outputs)
        if error is None:
            try:
                rows = job_rows(
                    run.payload,
                    run.prompt,
                    outputs,
                    job_id=flight.job.id,
                    worker=self.name,
                    model=self.model_name,
                    started=run.started,
                    finished=time.time(),
                    stamp=self.stamp,
                )
            except Exception as exc:  # noqa: BLE001 - this request's output, not the worker's problem
                error = f"its result could not be made into rows ({describe(exc)})"
        if error is not None:
            del flight.running[run.payload.custom_id]
            self._fail_request(flight, run.payload, error, run.started, prompt=run.prompt, model=self.model_name)
            return
        sink = self._sink(flight.batch_id)
        for row in rows:
            sink.add(row)
        del flight.running[run.payload.custom_id]
        self.finished.append((flight, run.payload, TokenCounts.of(run.payload, outputs)))

    def _flush(self, force: bool) -> int:
        """Write due part files; then, and only then, count their requests, and finish in RQ the jobs whose every
        request is counted. Returns how many jobs it finished."""
        if self.finished and (force or any(s.due() for s in self.sinks.values())):
            for sink in self.sinks.values():
                sink.flush()
            with self.held_lock:
                with self.connection.pipeline(transaction=False) as pipe:  # all of them in one round trip
                    for _, payload, counts in self.finished:
                        count_finished(pipe, payload, counts)
                    pipe.execute()  # if Redis fails, all are counted again next time: a request counts once
                counted, self.finished = self.finished, []
                self.jobs_done += len(counted)
                for flight, payload, _ in counted:
                    flight.unsettled.discard(payload.custom_id)
                    self._settle(flight)
        return self._finish_settled()  # and a batch those counts ended is released once RQ has finished its jobs

    def _settle(self, flight: InFlight) -> None:
        """A job whose every request is counted waits to be finished in RQ (the caller holds held_lock or the job is
        not yet held)."""
        if flight.settled and not flight.ended and flight not in self.settled:
            self.in_flight.pop(flight.job.id, None)
            self.settled.append(flight)

    def _finish_settled(self) -> int:
        """Finish in RQ the jobs whose every request is counted; returns how many."""
        finished = []
        with self.held_lock:
            while self.settled:  # one by one: a job Redis failed on stays, to be finished again
                flight = self.settled[0]
                result = (
                    {"requests": len(flight.job.meta.get("custom_ids", ())), "batch_id": flight.batch_id}
                    if flight.group
                    else {"custom_id": flight.job.meta.get("custom_id")}
                )
                rq_private.finalize_success(self, flight.job, flight.queue, flight.execution, result)
                finished.append(self.settled.pop(0))
        self._release_ended({flight.batch_id for flight in finished})
        return len(finished)
