"""The page's time series on a real Redis (worker/fleet/observe/series.py): workers append a point per step as they
publish their hash, two workers leave one point per step of a batch they share, the streams are capped and
expire, and readers turn counters into rates over a span and thin long series."""

from __future__ import annotations

import pytest
import redis

from miro.core.engine.stats import EngineStats
from miro.worker.fleet.records import keys, workers
from miro.worker.fleet.observe import series
from miro.worker.fleet.records.batches import BatchRecord
from miro.worker.fleet.observe.series import BatchPoint, SeriesWriter

T0 = 1_800_000_000.0  # a step boundary (a multiple of 5 s)


class Writer(SeriesWriter):
    """A SeriesWriter fed worker records, as workers.publish feeds it."""

    def add(self, conn, record: workers.WorkerRecord) -> bool:
        return self.append(conn, record.name, workers.series_point(record), record.batches)


def worker(name, t, *, tokens_per_s=0.0, done=0, kv=0.0, batches=()):
    return workers.WorkerRecord(
        name=name,
        model="m",
        updated_at=t,
        batches=list(batches),
        jobs_done=done,
        stats=EngineStats(kv_usage=kv, generation_tokens_per_s=tokens_per_s, running=2),
    )


def batch(conn, completed, tokens, status="in_progress", started=T0 - 10):
    record = BatchRecord(
        id="batch_s",
        status=status,
        created_at=T0 - 20,
        total=100,
        completed=completed,
        completion_tokens=tokens,
        stamps={"in_progress": started},
    )
    conn.hset(record.key(record.id), mapping=record.to_hash())
    return record


@pytest.fixture
def conn(redis_url):
    return redis.Redis.from_url(redis_url)


def test_a_worker_appends_one_point_per_step_and_its_batches_counters(conn):
    writer = Writer()
    batch(conn, completed=3, tokens=30)
    assert writer.add(conn, worker("w1", T0 + 0.2, tokens_per_s=50, done=3, kv=0.25, batches=["batch_s"]))
    assert not writer.add(conn, worker("w1", T0 + 1.2, tokens_per_s=99, done=4))  # the same step: nothing
    batch(conn, completed=8, tokens=80)
    assert writer.add(conn, worker("w1", T0 + 5.1, tokens_per_s=60, done=8, kv=0.5, batches=["batch_s"]))
    [points] = series.worker_series(conn, T0 - 1).values()
    assert [(p.t, p.tokens_per_s, p.requests, p.kv_usage, p.running) for p in points] == [
        (T0 + 0.2, 50.0, 3, 0.25, 2),
        (T0 + 5.1, 60.0, 8, 0.5, 2),
    ]
    assert [e[0] for e in conn.xrange(keys.worker_series("w1"))] == [b"1800000000000-0", b"1800000005000-0"]
    stored = series._points(BatchPoint, conn.xrange(keys.batch_series("batch_s")))
    assert [(p.finished, p.tokens) for p in stored] == [(3, 30), (8, 80)]
    assert 0 < conn.ttl(keys.batch_series("batch_s")) <= 86400 and 0 < conn.ttl(keys.worker_series("w1")) <= 86400


def test_two_workers_on_one_batch_leave_one_point_per_step(conn):
    batch(conn, completed=1, tokens=10)
    first, second = Writer(), Writer()
    first.add(conn, worker("w1", T0 + 0.5, batches=["batch_s"]))
    second.add(conn, worker("w2", T0 + 0.9, batches=["batch_s"]))  # same step: Redis refuses its point
    assert conn.xlen(keys.batch_series("batch_s")) == 1
    assert sorted(series.worker_series(conn, T0 - 1)) == ["w1", "w2"]


def test_a_stream_is_capped(conn):
    writer = Writer(max_points=10)
    for i in range(40):
        writer.add(conn, worker("w1", T0 + 5 * i))
    entries = conn.xrange(keys.worker_series("w1"))
    assert len(entries) == 10 and entries[0][0] == f"{int(T0 + 150) * 1000}-0".encode()  # the newest ten


def test_batch_rates_span_the_window_and_end_at_the_batch_now(conn):
    record = batch(conn, completed=0, tokens=0, started=T0)
    writer = Writer()
    for i in range(1, 13):  # a request and 10 tokens a second, counted every 5 s
        batch(conn, completed=5 * i, tokens=50 * i, started=T0)
        writer.add(conn, worker("w1", T0 + 5 * i + 0.1, batches=["batch_s"]))
    record = batch(conn, completed=62, tokens=620, started=T0)
    points = series.batch_points(conn, record, now=T0 + 62)
    assert (points[0].t, points[0].finished, points[-1].t, points[-1].finished) == (T0, 0, T0 + 62, 62)
    rates = series.batch_rates(points, span_s=30)
    assert len(rates) == len(points) - 1
    assert all(r.requests_per_s == pytest.approx(1.0, rel=0.05) for r in rates)
    assert all(r.tokens_per_s == pytest.approx(10.0, rel=0.05) for r in rates)
    ended = batch(conn, completed=100, tokens=1000, status="completed", started=T0)
    ended.stamps["completed"] = T0 + 70
    assert series.batch_points(conn, ended, now=T0 + 500)[-1].t == T0 + 70


def test_fleet_rates_sum_the_workers_step_by_step(conn):
    for name, per_s in (("w1", 2), ("w2", 3)):
        writer = Writer()
        for i in range(4):
            writer.add(conn, worker(name, T0 + 5 * i + 1, tokens_per_s=10.0 * per_s, done=5 * per_s * i))
    fleet = series.fleet_rates(series.worker_series(conn, T0 - 1))
    assert [p.t for p in fleet] == [T0, T0 + 5, T0 + 10, T0 + 15]
    assert [p.tokens_per_s for p in fleet] == [50.0] * 4
    assert [p.requests_per_s for p in fleet] == [0.0, 5.0, 5.0, 5.0]


def test_counters_that_go_back_start_the_rates_anew_and_long_series_are_thinned():
    rates = series.rates([(0, 0, 0), (5, 10, 100), (10, 2, 20), (15, 7, 70)], span_s=5)
    assert [(r.t, r.requests_per_s) for r in rates] == [(5, 2.0), (15, 1.0)]
    thinned = series.thinned(list(range(1000)), most=11)
    assert thinned[0] == 0 and thinned[-1] == 999 and len(thinned) == 11


def test_stored_points_read_each_entry_once_and_agree_with_a_whole_read(conn):
    writer, stored = Writer(), series.StoredPoints(size=1)
    for i in range(3):
        batch(conn, completed=i, tokens=10 * i)
        writer.add(conn, worker("w1", T0 + 5 * i, batches=["batch_s"]))
    assert [p.finished for p in stored.of(conn, "batch_s")] == [0, 1, 2]
    assert stored.read["batch_s"][0] == f"{int(T0 + 10) * 1000}-0"  # where the next read starts after
    for i in range(3, 5):
        batch(conn, completed=i, tokens=10 * i)
        writer.add(conn, worker("w1", T0 + 5 * i, batches=["batch_s"]))
    record = batch(conn, completed=5, tokens=50)
    assert series.batch_points(conn, record, T0 + 30, stored) == series.batch_points(conn, record, T0 + 30)
    assert [p.finished for p in stored.of(conn, "batch_s")] == [0, 1, 2, 3, 4]
    stored.of(conn, "batch_other")
    assert list(stored.read) == ["batch_other"]  # only the last `size` batches are kept
