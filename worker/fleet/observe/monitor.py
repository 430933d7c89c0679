"""The read side of `miro status` and `miro watch`: snapshots of batches and workers.

A `BatchView` is a batch record (batches.BatchRecord, which has ``done``, ``remaining``, ``tokens`` and the time
in progress) plus what is derived from it at one moment:

- ``age_s``: since the batch was created
- ``elapsed_s``: since it went in_progress, up to when it finished (None before it started)
- ``tokens_per_s``, ``requests_per_s``: over ``elapsed_s``, or over the last seconds when a RateWindow is given
- ``eta_s``: remaining / requests_per_s while the batch is in_progress (None when unknown)
- with the live worker records at hand, while the batch is in progress and a worker has its requests in flight:
  ``tokens_per_s`` is what those workers do now (their last 10 s, a worker's rate shared equally among the
  batches it has in flight), and ``eta_s`` the remaining requests' tokens (at the batch's tokens per finished
  request) at that rate. Counters move only when part files are written, so early in a batch they say little.
  ``rate_source`` says which: "workers" or "counters".

Nothing here prints; cli/monitor.py renders these views (`to_dict` is their JSON).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import redis

from miro.worker.fleet.records import batches, workers
from miro.worker.fleet.records.batches import BatchRecord
from miro.worker.fleet.records.workers import WorkerRecord


@dataclass
class BatchView:
    batch: BatchRecord
    age_s: float
    elapsed_s: float | None
    requests_per_s: float | None
    tokens_per_s: float | None
    eta_s: float | None
    rate_source: str  # "workers" or "counters"

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.batch.to_dict(),
            "age_s": self.age_s,
            "elapsed_s": self.elapsed_s,
            "requests_per_s": self.requests_per_s,
            "tokens_per_s": self.tokens_per_s,
            "eta_s": self.eta_s,
            "rate_source": self.rate_source,
        }


@dataclass
class Snapshot:
    """Batches and workers as one read of Redis saw them."""

    batches: list[BatchView]
    workers: list[WorkerRecord]

    def to_dict(self) -> dict[str, Any]:
        return {"batches": [b.to_dict() for b in self.batches], "workers": [w.to_dict() for w in self.workers]}

    @property
    def finished(self) -> bool:
        """True once no batch of the snapshot is active."""
        return not any(b.batch.is_active for b in self.batches)


@dataclass
class BatchSnapshot:
    """One batch and the workers relevant to it (`miro status BATCH`)."""

    batch: BatchView
    workers: list[WorkerRecord]

    def to_dict(self) -> dict[str, Any]:
        return {"batch": self.batch.to_dict(), "workers": [w.to_dict() for w in self.workers]}


def batch_view(
    batch: BatchRecord,
    now: float | None = None,
    window: RateWindow | None = None,
    worker_records: list[WorkerRecord] | None = None,
) -> BatchView:
    """The batch record plus the derived figures (see the module docstring)."""
    now = time.time() if now is None else now
    requests_per_s, tokens_per_s = batch.rates_since_start(now) or (None, None)
    if window is not None:
        window.add(now, batch.done, batch.tokens)
        recent = window.rates()
        if recent is not None:
            requests_per_s, tokens_per_s = recent
    in_progress = batch.status == "in_progress"
    view = BatchView(
        batch=batch,
        age_s=batch.age_s(now),
        elapsed_s=batch.elapsed_s(now),
        requests_per_s=requests_per_s,
        tokens_per_s=tokens_per_s,
        eta_s=eta_s(batch.remaining, requests_per_s) if in_progress else None,
        rate_source="counters",
    )
    live = live_tokens_per_s(batch, worker_records) if in_progress else None
    if live:
        view.tokens_per_s, view.rate_source = live, "workers"
        if batch.done and batch.tokens:
            view.eta_s = batch.remaining * (batch.tokens / batch.done) / live
    return view


def live_tokens_per_s(batch: BatchRecord, worker_records: list[WorkerRecord] | None) -> float | None:
    """Tokens/s the workers with the batch's requests in flight do now; None if none reports any."""
    shares = [w.tokens_per_s / len(w.batches) for w in worker_records or () if batch.id in w.batches and w.tokens_per_s]
    return sum(shares) if shares else None


def eta_s(remaining: int, requests_per_s: float | None) -> float | None:
    if remaining == 0:
        return 0.0
    if not requests_per_s:
        return None
    return remaining / requests_per_s


class RateWindow:
    """Requests/s and tokens/s of one batch over the last `window_s` seconds of samples.

    Counters move in steps (a worker counts requests when it writes their part file), so the window must span
    at least `min_span_s` before its rates are trusted; until then rates() is None and callers use the
    since-start average.
    """

    def __init__(self, window_s: float = 30.0, min_span_s: float = 5.0):
        self.window_s, self.min_span_s = window_s, min_span_s
        self.samples: deque[tuple[float, int, int]] = deque()  # (time, done, tokens)

    def add(self, t: float, done: int, tokens: int) -> None:
        if self.samples and done < self.samples[-1][1]:
            self.samples.clear()  # counters went back (retry, --resume): the old samples say nothing now
        self.samples.append((t, done, tokens))
        # keep one sample at or before the window's start, so the window spans all of window_s
        while len(self.samples) > 2 and self.samples[1][0] <= t - self.window_s:
            self.samples.popleft()

    def rates(self) -> tuple[float, float] | None:
        """(requests/s, tokens/s) over the window, or None while it spans less than min_span_s."""
        if len(self.samples) < 2:
            return None
        (t0, done0, tokens0), (t1, done1, tokens1) = self.samples[0], self.samples[-1]
        span = t1 - t0
        if span < self.min_span_s:
            return None
        return (done1 - done0) / span, (tokens1 - tokens0) / span


def relevant_workers(worker_records: list[WorkerRecord], batch: BatchRecord) -> list[WorkerRecord]:
    """Workers with requests of the batch in flight, or serving the batch's queue."""
    return [w for w in worker_records if batch.id in w.batches or batch.queue in w.queues]


def batch_snapshot(
    conn: redis.Redis, batch_id: str, now: float | None = None, window: RateWindow | None = None
) -> BatchSnapshot:
    """The batch's view and the workers relevant to it; MiroError for an unknown batch."""
    batch = batches.get_batch(conn, batch_id)
    its_workers = relevant_workers(workers.list_workers(conn), batch)
    return BatchSnapshot(batch_view(batch, now, window, its_workers), its_workers)


def fleet_snapshot(conn: redis.Redis, now: float | None = None) -> Snapshot:
    """Every batch's view, newest first, and every live worker's record."""
    now = time.time() if now is None else now
    records = workers.list_workers(conn)
    return Snapshot([batch_view(b, now, None, records) for b in batches.list_batches(conn)], records)


def watch_snapshot(
    conn: redis.Redis, batch_id: str | None, windows: dict[str, RateWindow], now: float | None = None
) -> Snapshot:
    """What one frame of `miro watch` shows, rates over each batch's window.

    With a batch id: that batch and its workers. Without: every active batch, plus those that were active
    earlier in the watch (each gets a window in `windows` when first shown), and every live worker.
    """
    now = time.time() if now is None else now
    if batch_id is not None:
        snapshot = batch_snapshot(conn, batch_id, now, windows.setdefault(batch_id, RateWindow()))
        return Snapshot([snapshot.batch], snapshot.workers)
    shown = [b for b in batches.list_batches(conn) if b.is_active or b.id in windows]
    records = workers.list_workers(conn)
    return Snapshot([batch_view(b, now, windows.setdefault(b.id, RateWindow()), records) for b in shown], records)
