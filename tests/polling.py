"""Small helpers the process-level tests share: a free TCP port, and polling until something holds."""

import socket
import time

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout_s: float = 60.0, every_s: float = 0.1):
    """Call `predicate` until it returns something truthy and return that; None after `timeout_s`.

    A Redis that refuses the connection (still starting) counts as "not yet".
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (redis.ConnectionError, redis.TimeoutError):
            pass
        time.sleep(every_s)
    return None
