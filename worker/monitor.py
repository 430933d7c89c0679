"""The read side of `miro status` and `miro watch`: snapshots of batches and workers, as plain dicts.

A batch view is the batch record (batches.py) plus derived figures:

- ``done`` (completed + failed + cancelled), ``remaining``, ``tokens`` (prompt + completion)
- ``age_s``: since the batch was created
- ``elapsed_s``: since it went in_progress, up to when it finished (None before it started)
- ``tokens_per_s``, ``requests_per_s``: over ``elapsed_s``, or over the last seconds when a RateWindow is given
- ``eta_s``: remaining / requests_per_s while the batch is in_progress (None when unknown)
- with the live worker records at hand, while the batch is in progress and a worker has its requests in flight:
  ``tokens_per_s`` is what those workers do now (their last 10 s, a worker's rate shared equally among the
  batches it has in flight), and ``eta_s`` the remaining requests' tokens (at the batch's tokens per finished
  request) at that rate. Counters move only when part files are written, so early in a batch they say little.
  ``rate_source`` says which: "workers" or "counters".

Nothing here prints; cli/monitor.py renders these dicts.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import redis

from . import batches, workers

TERMINAL = frozenset({"completed", "failed", "cancelled"})
# the timestamp that ends a batch's run, per terminal status
END_STAMP = {"completed": "completed_at", "failed": "failed_at", "cancelled": "cancelled_at"}


def is_active(batch: dict[str, Any]) -> bool:
    return batch["status"] not in TERMINAL


def elapsed_s(batch: dict[str, Any], now: float) -> float | None:
    """Seconds the batch has been (or was) in progress; None if it never started."""
    started = batch.get("in_progress_at")
    if started is None:
        return None
    # Only a terminal status's own stamp ends the run: a batch resumed after completing keeps its old
    # completed_at, which is before its new in_progress_at.
    ended = batch.get(END_STAMP.get(batch["status"], ""), now)
    return max(ended - started, 0.0)


def batch_view(batch: dict[str, Any], now: float | None = None, window: RateWindow | None = None,
               worker_records: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The batch record plus the derived figures (see the module docstring)."""
    now = time.time() if now is None else now
    view = dict(batch)
    view["done"] = batch["completed"] + batch["failed"] + batch["cancelled"]
    view["remaining"] = max(batch["total"] - view["done"], 0)
    view["tokens"] = batch["prompt_tokens"] + batch["completion_tokens"]
    view["age_s"] = max(now - batch["created_at"], 0.0)
    view["elapsed_s"] = elapsed_s(batch, now)
    requests_per_s = tokens_per_s = None
    if view["elapsed_s"]:
        requests_per_s, tokens_per_s = view["done"] / view["elapsed_s"], view["tokens"] / view["elapsed_s"]
    if window is not None:
        window.add(now, view["done"], view["tokens"])
        recent = window.rates()
        if recent is not None:
            requests_per_s, tokens_per_s = recent
    view["requests_per_s"], view["tokens_per_s"] = requests_per_s, tokens_per_s
    view["eta_s"] = eta_s(view["remaining"], requests_per_s) if batch["status"] == "in_progress" else None
    view["rate_source"] = "counters"
    live = live_tokens_per_s(batch, worker_records) if batch["status"] == "in_progress" else None
    if live:
        view["tokens_per_s"], view["rate_source"] = live, "workers"
        if view["done"] and view["tokens"]:
            view["eta_s"] = view["remaining"] * (view["tokens"] / view["done"]) / live
    return view


def live_tokens_per_s(batch: dict[str, Any], worker_records: list[dict[str, Any]] | None) -> float | None:
    """Tokens/s the workers with the batch's requests in flight do now; None if none reports any."""
    shares = [w["tokens_per_s"] / len(w["batches"]) for w in worker_records or ()
              if batch["id"] in w.get("batches", []) and w.get("tokens_per_s")]
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


def relevant_workers(worker_records: list[dict[str, Any]], batch: dict[str, Any]) -> list[dict[str, Any]]:
    """Workers with requests of the batch in flight, or serving the batch's queue."""
    return [w for w in worker_records
            if batch["id"] in w.get("batches", []) or batch.get("queue") in w.get("queues", [])]


def batch_snapshot(conn: redis.Redis, batch_id: str, now: float | None = None,
                   window: RateWindow | None = None) -> dict[str, Any]:
    """{"batch": view, "workers": [records of the workers relevant to it]}; MiroError for an unknown batch."""
    batch = batches.get_batch(conn, batch_id)
    its_workers = relevant_workers(workers.list_workers(conn), batch)
    return {"batch": batch_view(batch, now, window, its_workers), "workers": its_workers}


def fleet_snapshot(conn: redis.Redis, now: float | None = None) -> dict[str, Any]:
    """{"batches": [every batch view, newest first], "workers": [every live worker's record]}."""
    now = time.time() if now is None else now
    records = workers.list_workers(conn)
    return {"batches": [batch_view(b, now, None, records) for b in batches.list_batches(conn)], "workers": records}


def watch_snapshot(conn: redis.Redis, batch_id: str | None, windows: dict[str, RateWindow],
                   now: float | None = None) -> dict[str, Any]:
    """What one frame of `miro watch` shows: {"batches": [...], "workers": [...]}, rates over each batch's window.

    With a batch id: that batch and its workers. Without: every active batch, plus those that were active
    earlier in the watch (each gets a window in `windows` when first shown), and every live worker.
    """
    now = time.time() if now is None else now
    if batch_id is not None:
        snapshot = batch_snapshot(conn, batch_id, now, windows.setdefault(batch_id, RateWindow()))
        return {"batches": [snapshot["batch"]], "workers": snapshot["workers"]}
    shown = [b for b in batches.list_batches(conn) if is_active(b) or b["id"] in windows]
    records = workers.list_workers(conn)
    return {"batches": [batch_view(b, now, windows.setdefault(b["id"], RateWindow()), records) for b in shown],
            "workers": records}


def watch_finished(snapshot: dict[str, Any]) -> bool:
    """True once no batch of the snapshot is active."""
    return not any(is_active(b) for b in snapshot["batches"])
