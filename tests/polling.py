"""Small helpers the process-level tests share: a free TCP port, polling until something holds, and two
workers of which one is killed mid-batch."""

import signal
import socket
import subprocess
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


def kill_one_of_two_workers(
    command: list[str], env: dict, progress, finished, kill_after: int = 4, total: int | None = None
) -> None:
    """Start two workers running `command`; SIGKILL one once `progress()` (requests counted) reaches
    `kill_after` (and, given the batch's `total`, check that it was still short of it then); return when
    `finished()` holds, both workers stopped. The caller checks what was counted."""
    doomed = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
    survivor = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: progress() >= kill_after, timeout_s=120, every_s=0.05)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()
        assert total is None or progress() < total, "the batch ended before the kill"
        assert wait_for(finished, timeout_s=240)
    finally:
        for proc in (doomed, survivor):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
