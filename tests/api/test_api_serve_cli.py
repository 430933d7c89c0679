"""`miro serve` mistakes a user can make end in one sentence and a non-zero exit, never a traceback."""

from __future__ import annotations

import socket
import subprocess

import pytest
from serve_process import MIRO, environment
from polling import free_port


def serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*MIRO, "serve", *args], capture_output=True, text=True, env=environment(), timeout=60)


def one_sentence(done: subprocess.CompletedProcess) -> str:
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 or lines[-1].startswith("Error:"), done.stderr
    return lines[-1]


def test_redis_unreachable_at_start(tmp_path):
    line = one_sentence(serve("--redis-url", f"redis://127.0.0.1:{free_port()}/0", "--storage", str(tmp_path)))
    assert line.startswith("Error: Cannot reach Redis at redis://127.0.0.1:")


def test_no_api_key_means_loopback_only(tmp_path, redis_url):
    line = one_sentence(serve("--redis-url", redis_url, "--host", "0.0.0.0", "--storage", str(tmp_path)))
    assert line == (
        "Error: Refusing to listen on 0.0.0.0 without an API key: give --api-key-file (or --api-key, "
        "MIRO_API_KEYS), or listen on 127.0.0.1."
    )


def test_a_taken_port(tmp_path, redis_url):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_sentence(serve("--redis-url", redis_url, "--port", str(port), "--storage", str(tmp_path)))
    assert line == f"Error: Cannot listen on 127.0.0.1:{port}: Address already in use."


@pytest.mark.parametrize(
    "args, says",
    [(["--port", "http"], "Invalid value for '--port'"), (["--no-such-flag"], "No such option '--no-such-flag'")],
)
def test_a_bad_flag(args, says):
    assert says in one_sentence(serve(*args))


def test_a_storage_location_that_cannot_be_used(tmp_path, redis_url):
    blocked = tmp_path / "file"
    blocked.write_text("")
    line = one_sentence(serve("--redis-url", redis_url, "--storage", str(blocked / "below")))
    assert line.startswith(f"Error: Cannot use the storage location '{blocked / 'below'}'")
