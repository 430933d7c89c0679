"""What a BatchWorker knows of the batches of its requests in flight: each one's status and completion deadline,
read from Redis once and again at each maintenance round (`refresh`), so that admitting a job costs no round trip.

A batch whose completion window has ended is expired when asked for (`status_of`), so no job of it starts after
its window, even between two of the worker's expiry rounds (expiry.py).
"""

from __future__ import annotations

import time

import redis

from miro.worker.fleet.records import batches
from miro.worker.fleet.lifecycle import expiry


class BatchStatuses:
    def __init__(self, connection: redis.Redis):
        self.connection = connection
        self.status: dict[str, str] = {}  # batch id -> status
        self.deadline: dict[str, float | None] = {}  # batch id -> its expires_at, read with its status

    def status_of(self, batch_id: str) -> str:
        """The batch's status, read on first use; a batch past its deadline is expired first."""
        if batch_id not in self.status:
            self._read(batch_id)
        deadline = self.deadline.get(batch_id)
        if deadline is not None and time.time() >= deadline and self.status[batch_id] not in batches.STOPPING:
            expiry.expire(self.connection, batch_id)
            self._read(batch_id)
        return self.status[batch_id]

    def refresh(self, batch_ids: set[str]) -> None:
        """Read the statuses of these batches (the ones with requests in flight) and forget every other; their
        deadlines are read again when next needed."""
        self.status = batches.statuses(self.connection, sorted(batch_ids))
        self.deadline = {b: d for b, d in self.deadline.items() if b in self.status}

    def stopping(self, batch_id: str) -> bool:
        """Whether the batch is being cancelled or expiring, as of the last read."""
        return self.status[batch_id] in batches.STOPPING

    def _read(self, batch_id: str) -> None:
        record = batches.get_batch(self.connection, batch_id)
        self.status[batch_id], self.deadline[batch_id] = record.status, record.expires_at
