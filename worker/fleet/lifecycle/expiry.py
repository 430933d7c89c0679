"""Expiry: a batch still running when its completion window ends stops, as OpenAI's Batch API does. The
requests it has not run are cancelled (they come back as `batch_expired` errors: results.collect), what finished
is kept, and the batch becomes ``expired`` with ``expired_at`` set; nothing of it runs after.

Expiry is a cancel by the clock and takes cancel's path (control.sweep): the batch moves to ``expiring``, its
queued jobs are taken off the queue and counted cancelled, workers abort its requests in flight and refuse any
that still reach them, and the count that accounts for the last request settles it as ``expired``
(scripts.COUNT), so each request is counted once whoever gets there first.

Whoever runs batches enforces it, so it holds with no server: every BatchWorker about once a second (and before
it starts a job whose batch's window has ended), and `miro serve`'s background loop. The due batches are the
head of `miro:batch-deadlines` (scored by expires_at); one caller at a time expires a batch, under the lock
`miro:batch:{id}:expiry-lock` (SET NX with a TTL, released only by its holder), and an expiring batch is swept
again every RESWEEP_S for the jobs RQ's clean-up put back on its queue.
"""

from __future__ import annotations

import time

import redis

from miro.core.errors import MiroError

from miro.worker.fleet.records import batches, keys, locks, scripts
from miro.worker.fleet.lifecycle import control

LOCK_TTL_MS = 30_000  # a holder that dies frees the lock after this long
RESWEEP_S = control.SWEEP_EVERY_S  # how often an expiring batch's queue is swept again, and a not-yet-due one looked at
DUE_PER_CALL = 16  # batches looked at per call; the rest wait for the next one (a second later)


def expire_due(conn: redis.Redis, now: float | None = None) -> list[str]:
    """Expire every batch whose window has ended (up to DUE_PER_CALL); returns those this call began expiring."""
    now = time.time() if now is None else now
    due = [b.decode() for b in conn.zrangebyscore(keys.batch_deadlines(), "-inf", now, start=0, num=DUE_PER_CALL)]
    return [batch_id for batch_id in due if expire(conn, batch_id, now)]


def expire(conn: redis.Redis, batch_id: str, now: float | None = None) -> bool:
    """Expire the batch if its window has ended; True if this call moved it to ``expiring``.

    A batch that has ended leaves the deadlines; one already expiring has its queue swept again; one not due (its
    window renewed by --resume, or still validating, or being cancelled) is looked at again later.
    """
    now = time.time() if now is None else now
    deadlines = keys.batch_deadlines()
    with locks.held(conn, keys.batch_expiry_lock(batch_id), LOCK_TTL_MS) as held:
        if not held:
            return False
        try:
            record = batches.get_batch(conn, batch_id)
        except MiroError:  # the record is gone
            conn.zrem(deadlines, batch_id)
            return False
        if record.expires_at is None or record.status in batches.TERMINAL:
            conn.zrem(deadlines, batch_id)
            return False
        if record.status == "expiring":
            control.sweep(conn, record)
            _rearm(conn, batch_id, now + RESWEEP_S)
            return False
        if not record.is_due(now):
            _rearm(conn, batch_id, max(record.expires_at, now + RESWEEP_S))
            return False
        try:
            batches.set_status(conn, batch_id, "expiring")
        except MiroError:  # it completed, or began cancelling, since it was read
            return False
        control.sweep(conn, record)  # and settle it at once if nothing is in flight
        _rearm(conn, batch_id, now + RESWEEP_S)
        return True


def _rearm(conn: redis.Redis, batch_id: str, when: float) -> None:
    """Look at the batch again at `when`, unless it ended meanwhile (its last count took it off the deadlines)."""
    scripts.REARM_DEADLINE(
        conn, [keys.batch_deadlines(), keys.batch(batch_id)], [batch_id, when, *sorted(batches.TERMINAL)]
    )
