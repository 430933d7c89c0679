"""A short Redis lock: SET NX with a TTL, released only by its holder, so a holder that dies frees it by itself."""

from __future__ import annotations

import secrets
from contextlib import contextmanager
from typing import Iterator

import redis

from miro.worker.fleet.records import scripts


@contextmanager
def held(conn: redis.Redis, key: str, ttl_ms: int) -> Iterator[bool]:
    """True while this caller holds the lock at `key`; False if another does."""
    token = secrets.token_hex(8)
    got = bool(conn.set(key, token, nx=True, px=ttl_ms))
    try:
        yield got
    finally:
        if got:
            scripts.RELEASE_LOCK(conn, [key], [token])
