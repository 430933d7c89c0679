"""`miro serve`'s duties that no request waits for, every SERVER_SWEEP_S on a thread of their own:

- the fleet's duties, as every worker runs them too (lifecycle/housekeeping.py): expire the batches whose completion
  window has ended, delete the RQ job keys of batches that ended a while ago, feed the batches whose requests wait in
  storage;
- write the output and error files of the batches whose run has just ended (the ids the settling count put in
  `miro:ended-batches`), so a batch reaches completed, cancelled or expired with its files without anyone asking;
- delete the files past their expires_at, records and bytes (FileStore.sweep_expired);
- at start and every LEFTOVER_SWEEP_S, remove what a server killed mid-request left in storage (leftovers.py).

A Redis that stops answering is said once in the log and tried again each round; a command Redis refuses, or any
other failure, is logged and tried again next round; nothing here ends the server.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from miro.core.defaults import SERVER_SWEEP_S
from miro.core.errors import MiroError
from miro.worker.fleet.records import batches, keys
from miro.worker.fleet.lifecycle import housekeeping

from miro.worker.api import batch_records, leftovers
from miro.worker.api.batch_shape import ENDED, with_result_files
from miro.worker.api.state import ServerState

log = logging.getLogger("miro.serve")

FINALIZE_PER_ROUND = 16  # ended batches whose files one round writes (the rest wait a round)


def finalize_ended(state: ServerState) -> list[str]:
    """Write the result files of batches that have just ended; returns the ids now done with."""
    done = []
    for raw in state.conn.srandmember(keys.ended_batches(), FINALIZE_PER_ROUND) or []:
        batch_id = raw.decode()
        try:
            record = batches.get_batch(state.conn, batch_id)
        except MiroError:  # the record is gone
            done.append(batch_id)
            continue
        ended = record.at(record.status) if record.status in ENDED else None
        if ended is not None:
            api = with_result_files(state.conn, state.store, record, batch_records.of(state.conn, record))
            if api.files_for != f"{ended:.3f}":
                continue  # another server or a request holds the claim: look again next round
        done.append(batch_id)  # written now, or the batch runs again (retried) and will end again
    if done:
        state.conn.srem(keys.ended_batches(), *done)
    return done


class Background(threading.Thread):
    def __init__(self, state: ServerState, interval_s: float = SERVER_SWEEP_S):
        super().__init__(name="miro-serve-background", daemon=True)
        self.state, self.interval_s = state, interval_s
        self._stopped = threading.Event()
        self._redis_down = False
        self._leftovers_due = 0.0  # monotonic time of the next leftovers sweep: the first round's

    def once(self) -> None:
        housekeeping.run_duties(self.state.conn, log=log.warning)
        finalize_ended(self.state)
        self.state.store.sweep_expired()
        if time.monotonic() >= self._leftovers_due:
            self._leftovers_due = time.monotonic() + leftovers.LEFTOVER_SWEEP_S  # a failing sweep waits its turn too
            leftovers.sweep(self.state.store)

    def run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            try:
                self.once()
                self._redis_down = False
            except (redis.ConnectionError, redis.TimeoutError) as err:
                if not self._redis_down:
                    log.warning("background duties wait for Redis (%s)", str(err).rstrip(".") or type(err).__name__)
                self._redis_down = True
            except Exception:  # a bug or a storage failure: said, and tried again next round
                log.exception("background duties failed; trying again in %.0f s", self.interval_s)

    def stop(self) -> None:
        self._stopped.set()
        self.join(timeout=10)
