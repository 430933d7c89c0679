"""The feeder: a batch's stored requests (spool.py) become RQ group jobs (job_writer.py) a chunk at a time, as the
fleet drains its queue.

Redis holds what is in flight, not the dataset: a batch's queue is kept at about FEED_SEATS_FACTOR x the seats of
the live workers serving it, plus FEED_MARGIN, and the rest waits in storage. Nobody owns the feeding, so it is no
single point of failure: `miro-submit` feeds the first window, then every BatchWorker each round (about once a
second) and `miro serve`'s background loop top up every batch in `miro:feeding`, one feeder per batch at a time
under `miro:batch:{id}:feed-lock`. A chunk is written by scripts.FEED_JOBS only if it is still the batch's next one
and the batch still runs, and that moves the batch's `fed` position in the same step: a feeder that dies before
the script wrote nothing, one that dies after it is done, and a restart from the AOF finds jobs and position
together. A cancel or expiry closes the feeding (scripts.CLOSE_FEED): what was never fed is counted cancelled at
once; a resume opens it again (REOPEN_FEED).
"""

from __future__ import annotations

import time
from typing import Callable

import pyarrow as pa
import redis

from miro.core import defaults
from miro.core.errors import MiroError

from miro.worker.fleet.records import batches, keys, locks, scripts, workers
from miro.worker.fleet.intake import spool
from miro.worker.fleet.intake.job_writer import JobWriter

_SEATS_CACHE_S = 2.0
_seats_cache: tuple[float, dict[str, int]] = (0.0, {})


def seats_by_queue(conn: redis.Redis) -> dict[str, int]:
    """Queue name -> the seats of the live workers that take jobs from it (read at most every couple of seconds)."""
    global _seats_cache
    read_at, seats = _seats_cache
    if time.monotonic() - read_at < _SEATS_CACHE_S:
        return seats
    seats = {}
    for record in workers.list_workers(conn):
        for queue in record.queues:
            seats[queue] = seats.get(queue, 0) + record.seats
    _seats_cache = (time.monotonic(), seats)
    return seats


def window(conn: redis.Redis, queue: str, requests_per_job: int = 1) -> int:
    """How many jobs a batch's queue should hold, each of `requests_per_job` requests."""
    requests = defaults.FEED_MARGIN + defaults.FEED_SEATS_FACTOR * seats_by_queue(conn).get(queue, 0)
    return -(-requests // requests_per_job)


def top_up(conn: redis.Redis, log: Callable[[str], None] | None = None) -> int:
    """Feed the batches in `miro:feeding` whose queue is short (the oldest FEED_BATCHES_PER_CALL first); returns
    the requests written. A batch whose stored requests cannot be read from here is said to `log` and left to the
    others that feed."""
    written = 0
    for batch_id in conn.zrange(keys.feeding(), 0, defaults.FEED_BATCHES_PER_CALL - 1):
        try:
            written += feed(conn, batch_id.decode())
        except MiroError as e:
            if log is not None:
                log(str(e))
    return written


def feed(conn: redis.Redis, batch_id: str, max_chunks: int = defaults.FEED_CHUNKS_PER_CALL) -> int:
    """Write the batch's next chunks until its queue holds a window (at most `max_chunks`); returns the requests
    written.
    A batch with nothing left to feed, or one that stopped, leaves `miro:feeding`."""
    try:
        batch = batches.get_batch(conn, batch_id)
    except MiroError:  # the record is gone
        conn.zrem(keys.feeding(), batch_id)
        return 0
    if not batch.feeding or batch.status in batches.STOPPING:
        conn.zrem(keys.feeding(), batch_id)
        return 0
    writer = JobWriter.for_batch(conn, batch)
    target = window(conn, batch.queue, batch.requests_per_job)
    if conn.llen(writer.queue.key) >= target:  # the common case, without taking the lock
        return 0
    written = 0
    with locks.held(conn, keys.batch_feed_lock(batch_id), defaults.FEED_LOCK_TTL_MS) as held:
        if not held:
            return 0
        batch = batches.get_batch(conn, batch_id)  # its position now: another feeder may have moved it
        for chunk in range(batch.fed, min(batch.fed + max_chunks, batch.chunks)):
            if conn.llen(writer.queue.key) >= target:  # the window is full (another feeder may just have filled it)
                break
            try:
                requests = spool.read_chunk(batch.output, batch_id, chunk)
            except (OSError, pa.ArrowException) as e:
                raise MiroError(
                    f"Cannot read chunk {chunk} of batch {batch_id}'s stored requests at {batch.output}: {e}"
                ) from None
            fed = writer.feed(chunk, requests)
            if fed < 0:  # closed, stopped or moved on meanwhile
                break
            written += fed  # moved on by one: FEED_JOBS wrote the chunk only if it was the next
    return written


def close(conn: redis.Redis, batch_id: str) -> int:
    """Stop feeding a cancelled or expiring batch: its unfed requests are counted cancelled; returns how many."""
    return int(scripts.CLOSE_FEED(conn, [keys.batch(batch_id), keys.feeding()], [batch_id]))


def reopen(conn: redis.Redis, batch: batches.BatchRecord) -> int:
    """Feed a resumed batch's unfed requests again; returns how many were counted cancelled before."""
    return int(scripts.REOPEN_FEED(conn, [keys.batch(batch.id), keys.feeding()], [batch.id, batch.created_at]))
