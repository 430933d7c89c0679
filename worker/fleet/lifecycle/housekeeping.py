"""The fleet's periodic duties, which every worker and every `miro serve` run about once a second, so that they hold
whichever of the two is running: batches past their completion window expire, the RQ job keys of batches that ended
a while ago go, and the batches whose requests wait in storage are fed to their queues."""

from __future__ import annotations

from typing import Callable

import redis

from miro.worker.fleet.intake import feed
from miro.worker.fleet.lifecycle import expiry, release


def run_duties(conn: redis.Redis, log: Callable[[str], object]) -> int:
    """One round of the duties; returns how many jobs the feed queued. `log` is told what the feed could not do."""
    expiry.expire_due(conn)
    release.release_stale(conn)
    return feed.top_up(conn, log=log)
