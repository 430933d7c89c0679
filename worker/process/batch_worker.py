"""BatchWorker: an RQ worker that keeps one model resident and many jobs in flight in one engine.

    rq worker -w miro.worker.BatchWorker -S rq.serializers.JSONSerializer miro     (model from MIRO_MODEL)

Like rq's SimpleWorker it never forks. Each turn of the loop it admits queued
jobs while the engine has room (a group job holds each of its requests, an
embedding one engine request per input: in_flight.py), runs one engine step, and
hands finished requests to the Parquet sink (delivering.py); a request is counted only after the
sink has made its rows durable, and a job is marked finished in RQ only once all
of its requests are counted, so a crash can repeat a request, never lose it.
About once a second it also runs the fleet's duties (lifecycle/housekeeping.py:
expiry, release, feed), aborts the requests of batches being cancelled or
expiring (cancelling.py) and of jobs past their timeout (failing.py), and
refreshes its `miro:worker:{name}` hash (presence.py). Heartbeats come from a
thread of their own (HeartbeatThread), so that no engine step, however long, and
no wait for a part-file flush lets a held job's heartbeat lapse: RQ would then
queue it again and it would run twice.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter

import redis

from rq.logutils import setup_loghandlers
from rq.job import Job
from rq.queue import Queue
from rq.utils import now
from rq.worker.base import BaseWorker, WorkerStatus

from miro.core import Engine, MiroError, defaults
from miro.core.defaults import PRIORITIES

from miro.worker.fleet.records import batches, rq_private, workers
from miro.worker.fleet.lifecycle import housekeeping
from miro.worker.fleet.intake import feed, routing
from miro.worker.fleet.lifecycle.control import uncounted_failures
from miro.worker.fleet.records.payload import JobPayload, is_group, payloads_of
from miro.worker.fleet.output.fingerprint import OutputStamp
from miro.worker.fleet.output.sink import ParquetSink

from miro.worker.process import taking
from miro.worker.process.batch_statuses import BatchStatuses
from miro.worker.process.in_flight import InFlight, RequestRun
from miro.worker.process.worker_config import WorkerConfig
from miro.worker.process.cancelling import Cancellation
from miro.worker.process.delivering import Delivery
from miro.worker.process.failing import FailureHandling
from miro.worker.process.presence import Presence
from miro.worker.process.jobs import (
    TokenCounts,
    add_requests,
    engine_stamp,
    is_suspect,
    not_counted,
    record_given_up,
    split_suspect_group,
)
from miro.worker.process.worker_support import (
    HeartbeatThread,
    OneLineErrors,
    PerJobLinesAtDebug,
    describe,
    engine_options_from_env,
    wait_for_redis,
)

ALLOWED_FUNCTIONS = frozenset({"miro.worker.jobs.generate"})
REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError)  # the worker waits for Redis; every other error it survives
MAX_TAKE_FAILURES = 10  # a burst worker whose takes fail this many times in a row ends (something else is wrong)


PUBSUB_POLL_S = 1.0  # how often the command-channel thread wakes (RQ's default: 60 s)


class BatchWorker(Delivery, FailureHandling, Cancellation, Presence, BaseWorker):
    def __init__(self, *args, engine_options: dict | None = None, **kwargs):
        """RQ's Worker arguments, `engine_options` (Engine.from_model's keywords; None: the MIRO_* environment's)
        and WorkerConfig's options by name (None or left out: the MIRO_* environment's, else the default)."""
        config = WorkerConfig.of({name: kwargs.pop(name) for name in list(kwargs) if name in WorkerConfig.names()})
        super().__init__(*args, **kwargs)
        self.config = config
        # every priority of each queue given, most urgent first: taking.take_next takes from the first with a job
        queues = [
            self.queue_class(name, connection=self.connection, job_class=self.job_class, serializer=self.serializer)
            for name in routing.worker_queues([q.name for q in self.queues])
        ]
        rq_private.set_queues(self, queues)
        # `rq info` and Worker.all() construct workers too: the model is loaded in work(), never here.
        self.model = config.model
        # the names whose requests this worker runs: its model's own, then those it serves the model under
        self.model_name = routing.model_name(self.model)
        self.served_names = [self.model_name, *(n for n in config.served_model_names if n != self.model_name)]
        self.engine_options = engine_options if engine_options is not None else engine_options_from_env()
        self.engine: Engine | None = None
        self.stamp: OutputStamp | None = None  # the model file and engine settings its rows carry (fingerprint.py)
        self.in_flight: dict[str, InFlight] = {}  # job id -> the job, while any of its requests runs
        self.by_request: dict[str, tuple[InFlight, RequestRun]] = {}  # engine request id -> its job and request
        self.finished: list[
            tuple[InFlight, JobPayload, TokenCounts]
        ] = []  # requests whose rows the sinks buffer: not counted
        self.settled: list[InFlight] = []  # jobs whose every request is counted, to be finished in RQ
        self.sinks: dict[str, ParquetSink] = {}  # output location -> its sink
        self.outputs: dict[str, str] = {}  # batch id -> output location
        self._stopping = False
        # after SIGTERM, how long jobs in flight may take to finish before the rest are requeued
        self.shutdown_grace_s = config.shutdown_grace_s
        self._stop_deadline = float("inf")
        self.step_seconds = 0.0  # time inside Engine.step; the rest of the loop is the worker's own overhead
        self.flush_rows, self.flush_seconds = (
            config.flush_rows,
            config.flush_seconds,
        )  # how often part files are written
        # A job's started-registry entry lives job_monitoring_interval + this; once it lapses (the worker
        # died), RQ's maintenance on any live worker queues the job again. RQ itself adds 60 s.
        self.heartbeat_slack_s = config.heartbeat_slack_s
        self.redis_wait_s = config.redis_wait_s  # how long it waits for a Redis that went away before it ends
        self.metrics_port, self.metrics_host = config.metrics_port, config.metrics_host  # Prometheus endpoint, if any
        self.jobs_done = self.jobs_failed = self.jobs_cancelled = 0  # requests counted completed, failed, cancelled
        self.batch_statuses = BatchStatuses(self.connection)  # the status of each batch with requests in flight
        self.record: workers.WorkerRecord | None = None  # the last one written to its hash (metrics.py reads it)
        self._last_refresh = 0.0
        self._last_feed = 0.0  # when it last fed because its queues ran dry
        self._starting: tuple[Job, Queue] | None = None  # the job being started (_admit)
        self._after_outage = False  # Redis answers again: look for a job taken just before it went away
        # Held jobs (in flight, or finished and waiting for their rows to be written) change hands only under
        # this lock, so the heartbeat thread never beats a job the loop has just finished, failed or requeued.
        self.held_lock = threading.Lock()
        self._heartbeats: HeartbeatThread | None = None
        self.errors = OneLineErrors(self.log, lambda: f"Worker {self.name}")  # what it survives, a line each

    # -- signals: only set flags; the loop acts on them between steps ---------------------------------

    handle_signals = True  # False: the caller handles SIGINT/SIGTERM and stops the worker with request_warm_stop

    def install_stop_handlers(self):
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return  # the caller's, or embedded in a thread: whoever started it stops it (request_warm_stop)
        signal.signal(signal.SIGINT, self._request_stop)
        signal.signal(signal.SIGTERM, self._request_stop)

    def request_warm_stop(self, grace_s: float | None = None) -> None:
        """Stop taking jobs; let those in flight finish for up to grace_s, then requeue the rest."""
        self._stopping = True
        self._stop_deadline = time.monotonic() + (self.shutdown_grace_s if grace_s is None else grace_s)

    def _request_stop(self, signum, frame):
        if self._stopping:  # a second signal: stop now, the in-flight jobs are requeued below
            raise SystemExit(1)
        self.log.info(
            "Worker %s: warm shut down requested, finishing jobs in flight (up to %.0f s)",
            self.name,
            self.shutdown_grace_s,
        )
        self.request_warm_stop()

    # -- the loop -------------------------------------------------------------------------------------

    def subscribe(self):
        """RQ's subscription to this worker's command channel, its thread waking every PUBSUB_POLL_S: RQ's own
        waits 60 s in redis-py's get_message, and its unsubscribe then held every worker's shutdown for up to
        that long (three tests of 60 s each in tests/worker/test_embedding_worker.py)."""
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(
            sleep_time=PUBSUB_POLL_S, daemon=True, exception_handler=self._pubsub_exception_handler
        )

    def work(
        self, burst: bool = False, logging_level: str | None = None, *args, max_jobs: int | None = None, **kwargs
    ) -> bool:
        if self.metrics_port is not None:
            from miro.worker.fleet.observe.metrics import serve_metrics

            serve_metrics(self, self.metrics_port, self.metrics_host)
        setup_loghandlers(logging_level or "INFO", name="rq.worker")  # bootstrap sets them too, after the load
        self.log.addFilter(PerJobLinesAtDebug())
        self.log.info("Worker %s: loading model %s", self.name, self.model)
        started = time.perf_counter()
        self.engine = Engine.from_model(
            self.model, log=lambda message: self.log.info("Worker %s: %s", self.name, message), **self.engine_options
        )
        self.log.info(
            "Worker %s: loaded %s in %.1f s, %s; %s; KV cache %s tokens (%s)",
            self.name,
            self.model,
            time.perf_counter() - started,
            self.engine.weight_choice,
            self.engine.cpu_description,
            f"{self.engine.kv_cache_tokens:,}",
            self.engine.kv_cache_dtype,
        )
        self.stamp = engine_stamp(self.engine, self.model)  # each row's request_hash and model_sha256
        self.bootstrap(logging_level or "INFO")
        routing.register_served_names(self.connection, self.served_names[1:], self.model)
        moved = routing.migrate_legacy_queues(self.connection, [q.name for q in self.queues])
        if moved:
            self.log.info("Worker %s: moved %s jobs from the priority queues of an earlier version", self.name, moved)
        self.install_stop_handlers()
        self._heartbeats = HeartbeatThread(self)
        self._heartbeats.start()
        self.started_at = time.time()
        done = take_failures = 0
        try:
            while True:
                try:
                    if self._after_outage:  # the reply to its last take may be what Redis lost
                        self._starting = self._starting or taking.lost_take(self)
                        self._after_outage = False
                    if self._starting is not None:  # Redis failed as it was being started: taken, not in flight
                        self._begin_guarded(*self._starting)
                    self.errors.guard("its periodic duties", self._tick)
                    if self.should_run_maintenance_tasks:
                        self.errors.guard("RQ's maintenance", self.run_maintenance_tasks)
                    if not self._stopping and (max_jobs is None or done + len(self.in_flight) < max_jobs):
                        survived = self.errors.count
                        self.errors.guard("taking jobs", self._admit, block=not self.in_flight and not burst)
                        # a job that could not be taken is off the queue: a burst worker tries the next ones
                        take_failures = take_failures + 1 if self.errors.count > survived else 0
                    if self.in_flight and time.monotonic() > self._stop_deadline:
                        self.errors.guard("writing part files", self._flush, force=True)
                        self._requeue_in_flight()
                    if not self.in_flight:
                        done += self.errors.guard("writing part files", self._flush, force=True) or 0
                        if (
                            burst
                            and not self._stopping
                            and (
                                self.errors.guard("feeding batches", self._feed_now, every_s=0.0)
                                or 0 < take_failures <= MAX_TAKE_FAILURES
                            )
                        ):
                            continue  # the queue ran dry, not the batches: a burst worker goes on
                        if burst or self._stopping or (max_jobs is not None and done >= max_jobs):
                            break
                        continue
                    self._step()
                    done += self.errors.guard("writing part files", self._flush, force=False) or 0
                except REDIS_DOWN as e:
                    # the engine keeps its requests and the sinks their rows: counted and finished once it answers
                    wait_for_redis(
                        self.connection, e, self.log, f"Worker {self.name}", lambda: self._stopping, self.redis_wait_s
                    )
                    self._after_outage = True
        except SystemExit:
            try:  # the requests done so far are counted, so the jobs put back run only the rest
                self._flush(force=True)
            finally:
                self._requeue_in_flight()
            raise
        finally:
            self._flush(force=True)
            self._heartbeats.stop()
            self._remove_record()
            self.teardown()
        return bool(done)

    def _step(self) -> None:
        """One engine step; each request whose last engine request finished gets its rows (written at the next
        flush), and a job with no request left in the engine leaves in_flight."""
        step_started = time.perf_counter()
        try:
            outputs = self.engine.step()
        except Exception as exc:  # noqa: BLE001 - the engine's own error, no request's: see _engine_failed
            self._engine_failed(exc)
            return
        finally:
            self.step_seconds += time.perf_counter() - step_started
        done = []
        for output in outputs:
            entry = self.by_request.pop(output.request_id, None) if output.finished else None
            if entry is not None and entry[1].take(output):  # the request's last engine request
                done.append(entry)
        for flight, run in done:  # rows made (no Redis: _start read the output location) before it leaves in_flight
            try:
                self._finish(flight, run)
            except REDIS_DOWN:
                raise
            except Exception as exc:  # noqa: BLE001 - this request's rows: it fails alone
                self.errors.report(f"writing the rows of request {run.payload.custom_id}", exc)
                flight.running.pop(run.payload.custom_id, None)
                self.errors.guard(
                    "failing a request",
                    self._fail_request,
                    flight,
                    run.payload,
                    f"its rows could not be written ({describe(exc)})",
                    run.started,
                    prompt=run.prompt,
                    model=self.model_name,
                )
        with self.held_lock:  # the heartbeat thread reads in_flight
            for flight, _ in done:
                if not flight.running:
                    self.in_flight.pop(flight.job.id, None)

    def _tick(self) -> None:
        """The worker's periodic duties, between engine steps."""
        if time.monotonic() - self._last_refresh >= workers.REFRESH_S:
            self._last_feed = time.monotonic()
            housekeeping.run_duties(self.connection, log=self._feed_log)
            self._cancel_cancelled_batches()
            self._enforce_timeouts()
            self._publish()
            self._last_refresh = time.monotonic()
        if not self.in_flight and self.get_state() == WorkerStatus.BUSY:  # RQ marks it busy when a job starts
            self.set_state(WorkerStatus.IDLE)

    def _feed_now(self, every_s: float = defaults.IDLE_POLL_S) -> bool:
        """Top up the queues of the batches being fed, at most every `every_s` (a worker with requests in flight
        looks for jobs at every engine step); True if it queued any."""
        if time.monotonic() - self._last_feed < every_s:
            return False
        self._last_feed = time.monotonic()
        return feed.top_up(self.connection, log=self._feed_log) > 0

    def _feed_log(self, message: str) -> None:
        self.log.warning("Worker %s: %s", self.name, message)

    def run_maintenance_tasks(self):
        """RQ's maintenance (abandoned jobs queued again, or failed when out of retries), then the batch side of
        the jobs it failed: their error rows and counts, so their batches still complete."""
        super().run_maintenance_tasks()
        for queue in self.queues:
            for job, custom_ids in uncounted_failures(self.connection, queue):
                try:
                    sink = self._sink(job.meta["batch_id"])
                except MiroError:  # its batch record is gone: nothing to count it in
                    continue
                self.errors.guard(
                    f"failing job {job.id}, which RQ gave up on",
                    record_given_up,
                    self.connection,
                    sink,
                    job,
                    queue,
                    custom_ids,
                    worker=self.name,
                )

    def _with_room(self) -> list[Queue]:
        """The queues a job may be taken from now: those of a priority with fewer than max_num_seqs requests at
        least as urgent in flight. The engine seats such a job, preempting less urgent ones if it must
        (core/engine/scheduler.py), so a worker full of low-priority requests still takes high-priority ones; the
        preempted ones wait in the engine and finish later."""
        in_flight = Counter()
        for flight in self.in_flight.values():
            in_flight[flight.priority] += flight.seats
        room = []
        for queue in self.queues:
            rank = PRIORITIES.index(routing.queue_priority(queue.name))
            if sum(in_flight[p] for p in PRIORITIES[: rank + 1]) < self.engine.scheduler.max_num_seqs:
                room.append(queue)
        return room

    def _admit(self, block: bool) -> None:
        """Take jobs while a priority has room; with nothing queued and `block`, wait IDLE_POLL_S first."""
        while queues := self._with_room():
            taken = taking.take_next(self, queues)
            if taken is None and self._feed_now():
                taken = taking.take_next(self, queues)
            if taken is None:
                if block:
                    time.sleep(defaults.IDLE_POLL_S)
                return
            block = False
            self._starting = taken  # off the queue: if Redis fails before it is in flight, it is started again
            self._begin_guarded(*taken)

    def _begin_guarded(self, job: Job, queue: Queue) -> None:
        """Start a taken job; an error in RQ's part of starting it (other than Redis going away: then it is started
        again) fails that job alone, in one log line, and the worker goes on."""
        try:
            self._begin(job, queue)
        except REDIS_DOWN:
            raise
        except Exception as exc:  # noqa: BLE001 - the job's data, or RQ's part of starting it
            self._starting = None
            self.errors.report(f"starting job {job.id}", exc)
            self.errors.guard(
                f"failing job {job.id}",
                self._fail,
                job,
                queue,
                None,
                f"the worker could not start this job ({describe(exc)})",
            )
        else:
            self._starting = None

    def _begin(self, job: Job, queue: Queue) -> None:
        execution = self.prepare_execution(job)
        self.prepare_job_execution(job, remove_from_intermediate_queue=True)  # and status started, atomically
        job.started_at = now()
        try:
            self._start(job, queue, execution)
        except REDIS_DOWN:
            raise
        except Exception as exc:  # noqa: BLE001 - what miro did not expect of this job: it fails, alone
            self.errors.report(f"starting job {job.id}", exc)
            with self.held_lock:
                flight = self.in_flight.get(job.id)
                if flight is not None:
                    self._leave_engine(flight)
                    self.in_flight.pop(job.id, None)
                    flight.ended = True
            self._fail(job, queue, execution, f"the worker could not start this job ({describe(exc)})")

    def _start(self, job: Job, queue: Queue, execution) -> None:
        started = time.time()
        if job.func_name not in ALLOWED_FUNCTIONS:
            self._fail(job, queue, execution, f"function {job.func_name} is not on this worker's allow-list")
            return
        try:
            payloads = payloads_of(job.kwargs)
            batch_id = payloads[0].batch_id
            status = self.batch_statuses.status_of(batch_id)
            self._sink(batch_id)  # its output read now: finishing it needs no Redis (a Redis outage then)
        except MiroError as err:  # not miro's payload, or its batch record is gone: nowhere to write a row
            self._fail(job, queue, execution, str(err))
            return
        except REDIS_DOWN:
            raise
        except Exception as err:  # noqa: BLE001 - Redis held a job miro did not write: it fails, alone
            self._fail(job, queue, execution, f"this job's data is not a miro request ({describe(err)})")
            return
        flight = InFlight(job, queue, execution, batch_id, payloads[0].priority, is_group(job.meta))
        if flight.group:
            payloads = not_counted(self.connection, payloads)
            if payloads and is_suspect(job):  # run again after its worker died: its requests go one job each
                queued = split_suspect_group(self.connection, job, queue, payloads)
                self.log.warning(
                    "Worker %s: job %s ran on a worker that died; its %d requests not yet counted are "
                    "queued again one job each (%d new), so that one that kills workers is quarantined "
                    "alone",
                    self.name,
                    job.id,
                    len(payloads),
                    queued,
                )
                payloads = []
        flight.unsettled = {p.custom_id for p in payloads}
        if status in batches.STOPPING:
            self._cancel([(flight, sorted(flight.unsettled))])
            return
        wanted = routing.model_name(payloads[0].model) if payloads else self.model_name
        for index, payload in enumerate(payloads):
            if flight.ended:
                break
            if wanted not in self.served_names:  # it reached a queue this worker was told to serve by --queue
                message = (
                    f"this request is for model '{wanted}', but worker {self.name} serves "
                    f"{', '.join(repr(n) for n in self.served_names)}: start a worker for '{wanted}' and run "
                    f"`miro retry {batch_id}`"
                )
                self._fail_request(flight, payload, message, started)
                continue
            base = f"{job.id}/{index}" if flight.group else job.id
            try:  # a generation for an embedding model, or the reverse, is refused here in the engine's sentence
                prompt, request_ids = add_requests(
                    self.engine, payload, base, routing.engine_priority(payload.priority)
                )
            except MiroError as err:
                self._fail_request(flight, payload, str(err), started, model=self.model_name)
                continue
            except REDIS_DOWN:
                raise
            except Exception as err:  # noqa: BLE001 - e.g. a chat template meeting messages it cannot render
                self._fail_request(
                    flight,
                    payload,
                    f"the engine could not take this request ({describe(err)})",
                    started,
                    model=self.model_name,
                )
                continue
            run = RequestRun(payload, prompt, started, request_ids)
            flight.running[payload.custom_id] = run
            self.by_request.update(dict.fromkeys(request_ids, (flight, run)))
        with self.held_lock:
            if flight.running:
                self.in_flight[job.id] = flight
            self._settle(flight)

    @property
    def requests_in_flight(self) -> int:
        """Requests taken and not yet counted."""
        return sum(len(flight.running) for flight in self.in_flight.values()) + len(self.finished)
