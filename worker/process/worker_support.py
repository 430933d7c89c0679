"""What a BatchWorker is set up with besides its arguments: the engine settings of a worker started by `rq worker
-w` (MIRO_* environment variables), the filter that keeps RQ's per-job log lines at DEBUG, the thread that
beats the heartbeats of every job the worker holds, the wait for a Redis that went away, and the worker's record."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any, Callable

import redis
from rq.worker.base import BaseWorker

from miro.core.engine.engine_config import EngineConfig
from miro.worker.fleet.records.workers import WorkerRecord

# RQ's own line for every job it dequeues and finishes: a worker running thousands of requests logs them at DEBUG
PER_JOB_LOG_FORMATS = frozenset(
    {
        "Worker %s: %s: %s (%s)",
        "Worker %s: %s: %s",  # dequeued
        "Successfully completed %s job in %ss on worker %s",
        "Successfully completed job %s in %ss on worker %s",
        "Worker %s: job %s result is kept for %s seconds",
        "Worker %s: job %s result discarded immediately",
    }
)


class PerJobLinesAtDebug(logging.Filter):
    """Turns RQ's per-job INFO lines into DEBUG ones (kept only where the logger is set to DEBUG)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO and record.msg in PER_JOB_LOG_FORMATS:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def engine_options_from_env() -> dict:
    """Engine settings for workers started by `rq worker -w`, which passes no options of its own: the MIRO_*
    variables of EngineConfig's fields (the same names the `miro` commands read)."""
    return EngineConfig.from_env()


ERROR_REPEAT_S = 60.0  # the same error from the same duty is logged again at most this often


def describe(exc: BaseException, limit: int = 300) -> str:
    """An exception in one line: its type and the first line of its message, cut to `limit` characters."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


class OneLineErrors:
    """What a worker survives: an error from a job, from RQ's maintenance or from Redis data it did not expect is
    one log line (the same one at most every ERROR_REPEAT_S), and the worker goes on. Redis going away is not
    survived here: the worker's loop waits for it (wait_for_redis)."""

    def __init__(self, log, who: Callable[[], str]):
        self.log, self.who = log, who
        self._last: dict[tuple[str, str], float] = {}
        self.count = 0  # errors survived, logged or not

    def report(self, doing: str, exc: BaseException) -> None:
        self.count += 1
        key = (doing, describe(exc))
        now = time.monotonic()
        if now - self._last.get(key, -ERROR_REPEAT_S) >= ERROR_REPEAT_S:
            self._last[key] = now
            self.log.error("%s: error while %s, going on: %s", self.who(), doing, key[1])

    def guard(self, doing: str, call: Callable, *args, **kwargs) -> Any:
        """call(*args, **kwargs); an error other than Redis going away (re-raised) is reported, and None returned."""
        try:
            return call(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError):
            raise
        except Exception as exc:  # noqa: BLE001 - the worker survives what its jobs and RQ do
            self.report(doing, exc)
            return None


class HeartbeatThread(threading.Thread):
    """Beats for the worker and every job it holds, every job_monitoring_interval (at most half the heartbeat
    TTL), whatever the main loop is doing; a Redis error here is left for the main loop to report. Its worker is a
    BatchWorker (batch_worker.py), which has heartbeat_held_jobs."""

    def __init__(self, worker: BaseWorker):
        super().__init__(name=f"{worker.name}-heartbeats", daemon=True)
        self.worker = worker
        self.interval_s = min(worker.job_monitoring_interval, worker.get_heartbeat_ttl(None) / 2)
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            try:
                self.worker.heartbeat_held_jobs()
            except redis.RedisError:
                pass

    def stop(self) -> None:
        self._stopped.set()
        self.join()


def wait_for_redis(
    conn: redis.Redis, error: Exception, log, who: str, stopping: Callable[[], bool], give_up_s: float
) -> None:
    """Redis went away (a restart, a network cut): say so once, then try again until it answers; raise `error` once
    `stopping()` or after `give_up_s` (the worker then ends in one sentence). A job whose heartbeat lapsed meanwhile
    may run again elsewhere; the merge keeps one row of it and the count counts it once."""
    log.warning(
        "%s: Redis is unreachable (%s); trying again for up to %.0f s",
        who,
        str(error).rstrip(".") or type(error).__name__,
        give_up_s,
    )
    deadline, pause = time.monotonic() + give_up_s, 0.5
    while not stopping() and time.monotonic() < deadline:
        time.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
        try:
            conn.ping()
        except (redis.ConnectionError, redis.TimeoutError):
            pause = min(pause * 2, 5.0)
            continue
        log.info("%s: Redis answers again", who)
        return
    raise error


def worker_record(worker) -> WorkerRecord:
    """What a BatchWorker's `miro:worker:{name}` hash holds (see worker/fleet/records/workers.py)."""
    with worker.connection.pipeline(transaction=False) as pipe:
        for queue in worker.queues:
            pipe.llen(queue.key)
        queued = sum(pipe.execute())
    engine = worker.engine
    return WorkerRecord(
        name=worker.name,
        model=worker.model_name,
        host=socket.gethostname(),
        pid=os.getpid(),
        queues=[q.name for q in worker.queues],
        state="stopping" if worker._stopping else "busy" if worker.in_flight else "idle",
        started_at=worker.started_at,
        updated_at=time.time(),
        batches=sorted({f.batch_id for f in worker.in_flight.values()}),
        architecture=engine.config.architecture,
        weight_format=engine.weight_format,
        weight_memory=engine.weight_memory,
        cpu_tier=engine.cpu_tier,
        stats=engine.stats(),
        in_flight=worker.requests_in_flight,
        seats=engine.scheduler.max_num_seqs,
        queued=queued,
        jobs_done=worker.jobs_done,
        jobs_failed=worker.jobs_failed,
        jobs_cancelled=worker.jobs_cancelled,
    )
