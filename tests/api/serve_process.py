"""Helpers of the `miro serve` tests: the server as a real process, its environment, batch input lines.

Not in conftest.py, so that test modules import them by a name no other conftest shares."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from polling import free_port, wait_for


def environment() -> dict[str, str]:
    """This process's environment as it is now (a test may have set credentials), one thread per pool."""
    return {**os.environ, "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}


MIRO = [sys.executable, "-c", "from miro.cli.main import cli; cli()"]


def chat_line(i: int, max_tokens: int = 4, content: str | None = None) -> dict:
    return {
        "custom_id": f"r{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "smollm2-135m",
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": content or f"Say {i}."}],
        },
    }


def jsonl(lines: list[dict]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


class Server:
    """A `miro serve` process; `client()` is the unmodified openai SDK pointed at it."""

    def __init__(self, redis_url: str, storage: Path | str, *extra: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.storage = storage
        self.process = subprocess.Popen(
            [*MIRO, "serve", "--redis-url", redis_url, "--port", str(self.port), "--storage", str(storage), *extra],
            env=environment(),
            stderr=subprocess.PIPE,
            text=True,
        )
        if not wait_for(self._answers, timeout_s=60, every_s=0.1):
            self.stop()
            pytest.fail(f"miro serve did not start: {self.process.stderr.read()}")

    def _answers(self) -> bool:
        if self.process.poll() is not None:
            pytest.fail(f"miro serve exited: {self.process.stderr.read()}")
        try:
            with urllib.request.urlopen(self.url + "/", timeout=1) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    def client(self, api_key: str = "unused"):
        from openai import OpenAI

        return OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=120)

    def get(self, path: str, api_key: str | None = None) -> tuple[int, bytes]:
        request = urllib.request.Request(
            self.url + path, headers={"Authorization": f"Bearer {api_key}"} if api_key else {}
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def stop(self) -> str:
        """Stop the server; returns what it wrote on stderr."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.stderr.read()
