"""A Redis connection that has answered PING, or one sentence saying why not; and the URL a connection was made for."""

from __future__ import annotations

import time

import redis

from miro.core.errors import MiroError
from miro.worker.fleet.observe.urls import redacted


def connect(url: str, timeout: float = 5.0, wait_s: float = 0.0, log=None) -> redis.Redis:
    """A Redis connection (bytes replies, as RQ needs) that has answered PING; MiroError in one sentence if not.

    With `wait_s`, an unreachable Redis is tried again every second for that long (logged once through `log`).
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return _connect(url, timeout)
        except _Unreachable as err:
            if time.monotonic() >= deadline:
                raise MiroError(str(err)) from None
            if log is not None:
                log(f"{err} Trying again for up to {deadline - time.monotonic():.0f} s.")
                log = None
            time.sleep(1.0)


class _Unreachable(Exception):
    pass


def _connect(url: str, timeout: float) -> redis.Redis:
    shown = redacted(url)
    try:
        conn = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=max(timeout, 30.0))
    except ValueError as e:
        raise MiroError(f"The Redis URL '{shown}' is not valid ({str(e).rstrip('.')}).") from None
    try:
        conn.ping()
    except redis.AuthenticationError:
        if conn.connection_pool.connection_kwargs.get("password"):
            raise MiroError(f"Redis at {shown} refused the credentials: the password (or user) is wrong.") from None
        raise MiroError(
            f"Redis at {shown} refused the credentials: it needs a password, given in the URL as "
            "redis://:PASSWORD@host:port/db."
        ) from None
    except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
        raise _Unreachable(
            f"Cannot reach Redis at {shown}: {str(e).rstrip('.') or type(e).__name__} (start one "
            "with `miro redis`, or give the right --redis-url / MIRO_REDIS_URL)."
        ) from None
    except redis.ResponseError as e:
        raise MiroError(f"Redis at {shown} refused PING ({str(e).rstrip('.')}).") from None
    return conn


def url_of(conn: redis.Redis) -> str:
    """The redis:// URL a connection was made for (no password), for messages."""
    kwargs = conn.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
    return f"redis://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
