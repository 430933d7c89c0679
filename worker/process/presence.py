"""How a BatchWorker shows it is alive: the heartbeat of the worker and of every job it holds (one pipeline, from
the HeartbeatThread), and its `miro:worker:{name}` record in Redis (workers.py). A mixin of BatchWorker, which holds
the state it reads."""

from __future__ import annotations

import redis
from rq.job import Job
from rq.utils import now

from miro.worker.fleet.records import workers
from miro.worker.process.worker_support import worker_record


class Presence:
    """The heartbeat and record duties of BatchWorker (worker/process/batch_worker.py holds the state)."""

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        return int(self.job_monitoring_interval + self.heartbeat_slack_s)

    def heartbeat_held_jobs(self) -> None:
        """One pipeline: the worker's heartbeat and that of every job it holds, in flight or waiting for its
        rows to be written (called by the HeartbeatThread)."""
        ttl = self.get_heartbeat_ttl(None)
        with self.held_lock, self.connection.pipeline() as pipe:
            self.heartbeat(max(ttl, self.worker_ttl), pipeline=pipe)
            held = {
                flight.job.id: flight
                for flight in [*self.in_flight.values(), *self.settled, *(flight for flight, _, _ in self.finished)]
                if not flight.ended
            }
            for flight in held.values():
                flight.execution.heartbeat(flight.queue.started_job_registry, ttl, pipe)
                flight.job.heartbeat(now(), ttl, pipe, xx=True)
            pipe.execute()

    def worker_record(self) -> workers.WorkerRecord:
        return worker_record(self)

    def _publish(self) -> None:
        self.record = self.worker_record()
        workers.publish(self.connection, self.record)

    def _remove_record(self) -> None:
        """The worker stops: its hash goes (metrics keep the final figures, for a last scrape)."""
        try:
            self.record = self.worker_record()
            workers.remove(self.connection, self.name)
        except redis.RedisError:
            pass  # Redis is gone: the record expires by itself
