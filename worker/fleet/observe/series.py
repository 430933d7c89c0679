"""Short time series of the fleet's figures in Redis, for the charts of `miro serve`'s page.

Who appends: each worker, as it rewrites its hash (workers.publish, about once a second), appends at most one point
per SERIES_STEP_S step: its own (KV use, running, waiting, tokens/s, requests done and failed so far) to
`miro:series:worker:{name}`, and, for each batch it has requests of in flight, that batch's counters (requests
finished, tokens) to `miro:series:batch:{id}`. A point is a Redis stream entry whose id is its step's start in
milliseconds, so when two workers append a batch's point for the same step one is kept: Redis refuses an entry
id that is not above the stream's last.

How it is bounded: every append trims its stream to SERIES_POINTS entries (a day at 5 s; an exact MAXLEN, one entry dropped per append once full) and sets its
TTL to SERIES_TTL_S, so a batch's or a stopped worker's series goes a day after its last point;
`miro:series:workers`, the workers with a series scored by their last point's time, drops those older than that.

Readers (the server's chart routes) turn counters into rates over at least SERIES_RATE_SPAN_S (counters move when
part files are written, in steps) and thin a long series to SERIES_MAX_POINTS.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import redis

from miro.core import defaults

from miro.worker.fleet.records import hashes, keys
from miro.worker.fleet.records.batches import BatchRecord


@dataclass
class WorkerPoint:
    """A worker at one step."""

    t: float
    kv_usage: float = 0.0
    running: int = 0
    waiting: int = 0
    tokens_per_s: float = 0.0  # the engine's rate over its last 10 s (prompt and generated tokens)
    requests: int = 0  # jobs done and failed since the worker started


@dataclass
class BatchPoint:
    """A batch's counters at one step."""

    t: float
    finished: int = 0  # completed + failed: requests that ran
    tokens: int = 0  # prompt + completion tokens counted so far


@dataclass
class RatePoint:
    """Rates at one moment: over the SERIES_RATE_SPAN_S (or more) before it."""

    t: float
    requests_per_s: float
    tokens_per_s: float


def step_of(t: float, step_s: float = defaults.SERIES_STEP_S) -> int:
    """The start of t's step, in ms: the id of the point appended during it."""
    return int(t // step_s * step_s * 1000)


class SeriesWriter:
    """A worker's appends: a point per step at most, however often it is asked."""

    def __init__(
        self,
        step_s: float = defaults.SERIES_STEP_S,
        max_points: int = defaults.SERIES_POINTS,
        ttl_s: int = defaults.SERIES_TTL_S,
    ):
        self.step_s, self.max_points, self.ttl_s = step_s, max_points, ttl_s
        self.last_step: int | None = None

    def append(self, conn: redis.Redis, name: str, point: WorkerPoint, batch_ids: list[str]) -> bool:
        """Append the worker's point, and a point of each batch it has requests of in flight, if this step has
        none from it yet; True if it did."""
        step = step_of(point.t, self.step_s)
        if step == self.last_step:
            return False
        self.last_step = step
        counters = _batch_counters(conn, batch_ids)
        pipe = conn.pipeline(transaction=False)
        self._add(pipe, keys.worker_series(name), step, point)
        pipe.zadd(keys.series_workers(), {name: point.t})
        pipe.zremrangebyscore(keys.series_workers(), "-inf", point.t - self.ttl_s)
        for batch in counters:
            self._add(
                pipe,
                keys.batch_series(batch.id),
                step,
                BatchPoint(t=point.t, finished=batch.finished, tokens=batch.tokens),
            )
        pipe.execute(raise_on_error=False)  # a batch's step another worker took first is refused, as meant
        return True

    def _add(self, pipe, key: str, step: int, point) -> None:
        pipe.xadd(key, hashes.hash_values(point), id=f"{step}-0", maxlen=self.max_points, approximate=False)
        pipe.expire(key, self.ttl_s)


def _batch_counters(conn: redis.Redis, batch_ids: list[str]) -> list[BatchRecord]:
    pipe = conn.pipeline(transaction=False)
    for batch_id in batch_ids:
        pipe.hgetall(keys.batch(batch_id))
    return [BatchRecord.from_hash(raw) for raw in pipe.execute() if raw]


def _points(cls, entries) -> list:
    """Stream entries (id, fields) as points of `cls`."""
    return [cls(**hashes.field_values(cls, hashes.decoded(values))) for _, values in entries]


def worker_series(conn: redis.Redis, since: float) -> dict[str, list[WorkerPoint]]:
    """Every worker's points since `since` (epoch seconds), by worker name."""
    names = [
        n.decode() if isinstance(n, bytes) else n for n in conn.zrangebyscore(keys.series_workers(), since, "+inf")
    ]
    pipe = conn.pipeline(transaction=False)
    for name in names:
        pipe.xrange(keys.worker_series(name), min=str(int(since * 1000)))
    return {name: points for name, entries in zip(names, pipe.execute()) if (points := _points(WorkerPoint, entries))}


class StoredPoints:
    """Batches' stored points as read so far, for the `size` batches last asked for. A stream only grows at its
    end, so each read asks Redis for the entries after the last one read: a page polled every second through a
    six-hour batch reads each of its points once, not the whole series every second."""

    def __init__(self, size: int = 16):
        self.size = size
        self.read: dict[str, tuple[str, list[BatchPoint]]] = {}  # batch id -> (last entry id, points)
        self._lock = threading.Lock()  # the server answers on several threads

    def of(self, conn: redis.Redis, batch_id: str) -> list[BatchPoint]:
        with self._lock:
            last_id, points = self.read.pop(batch_id, (None, []))
            entries = conn.xrange(keys.batch_series(batch_id), min="-" if last_id is None else f"({last_id}")
            if entries:
                last_id = hashes.decoded({"id": entries[-1][0]})["id"]
                points = points + _points(BatchPoint, entries)
            self.read[batch_id] = (last_id, points)  # now the most recent
            while len(self.read) > self.size:
                self.read.pop(next(iter(self.read)))
            return points


def batch_points(
    conn: redis.Redis, batch: BatchRecord, now: float, stored: StoredPoints | None = None
) -> list[BatchPoint]:
    """A batch's points, from when it went in progress (nothing counted yet) to now or when it ended (its
    counters then): the stream's points between (read through `stored`, when given)."""
    started = batch.at("in_progress")
    if started is None:
        return []
    ended = batch.at(batch.status) if not batch.is_active else None
    last = BatchPoint(t=ended if ended is not None else now, finished=batch.finished, tokens=batch.tokens)
    read = (
        stored.of(conn, batch.id)
        if stored is not None
        else _points(BatchPoint, conn.xrange(keys.batch_series(batch.id)))
    )
    return [BatchPoint(t=started), *(p for p in read if started < p.t < last.t), last]


def rates(points: list[tuple[float, int, int]], span_s: float = defaults.SERIES_RATE_SPAN_S) -> list[RatePoint]:
    """(time, requests, tokens) counters as rates at each point after the first, each over the shortest run of
    points back that spans `span_s` (or all of them, early on). Counters that went back (a retry) start anew."""
    out = []
    start = 0
    for i in range(1, len(points)):
        t, requests, tokens = points[i]
        if requests < points[i - 1][1]:
            start = i
            continue
        j = i - 1
        while j > start and t - points[j][0] < span_s:
            j -= 1
        dt = t - points[j][0]
        if dt > 0:
            out.append(
                RatePoint(t=t, requests_per_s=(requests - points[j][1]) / dt, tokens_per_s=(tokens - points[j][2]) / dt)
            )
    return out


def batch_rates(points: list[BatchPoint], span_s: float = defaults.SERIES_RATE_SPAN_S) -> list[RatePoint]:
    return rates([(p.t, p.finished, p.tokens) for p in points], span_s)


def fleet_rates(series: dict[str, list[WorkerPoint]], step_s: float = defaults.SERIES_STEP_S) -> list[RatePoint]:
    """The fleet's tokens/s (its workers' summed, step by step) and requests/s (each worker's finished requests
    over the step before, summed)."""
    by_step: dict[int, list[float]] = {}
    for points in series.values():
        for before, point in zip([None, *points], points):
            step = by_step.setdefault(step_of(point.t, step_s), [0.0, 0.0])
            step[1] += point.tokens_per_s
            if before is not None and point.t > before.t and point.requests >= before.requests:
                step[0] += (point.requests - before.requests) / (point.t - before.t)
    return [RatePoint(t=step / 1000, requests_per_s=r, tokens_per_s=tok) for step, (r, tok) in sorted(by_step.items())]


def thinned(points: list, most: int = defaults.SERIES_MAX_POINTS) -> list:
    """At most `most` of the points, evenly spread, the first and the last kept."""
    if len(points) <= most:
        return points
    every = (len(points) - 1) / (most - 1)
    return [points[round(i * every)] for i in range(most)]
