"""`miro` fleet processes for the end-to-end fleet tests (tests/e2e/test_fleet*.py): a dataset submitted through
the CLI, `miro worker` as its own process (one thread each: two workers share 2 cores) or a burst BatchWorker in the
test's process, the rows a batch has written, and stopping a worker."""

import json
import os
import signal
import subprocess
import sys

from click.testing import CliRunner
from rq import Queue
from rq.serializers import JSONSerializer

from miro.cli.main import cli
from miro.worker import BatchWorker
from miro.worker.fleet.intake.routing import queue_for
from miro.worker.fleet.output.results import read_parts


def submit(tmp_path, redis_url, tiny_model, lines, name="d.jsonl") -> str:
    dataset = tmp_path / name
    dataset.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = CliRunner().invoke(
        cli,
        ["submit", str(dataset), "--redis-url", redis_url, "--model", tiny_model, "--output", str(tmp_path / "out")],
    )
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


def long_lines(n: int, max_tokens: int = 100) -> list[dict]:
    return [{"id": f"p{i}", "prompt": f"hello {i}", "max_tokens": max_tokens, "ignore_eos": True} for i in range(n)]


def worker_command(redis_url, tiny_model, *extra) -> tuple[list[str], dict]:
    """`miro worker` as its own process, one thread each (two workers share 2 cores): its command and env."""
    command = [
        sys.executable,
        "-c",
        "from miro.cli.main import cli; cli()",
        "worker",
        "--redis-url",
        redis_url,
        "--model",
        tiny_model,
        "--kv-cache-memory",
        "8MiB",
        "--max-num-seqs",
        "4",
        "--flush-rows",
        "1",
        *extra,
    ]
    return command, {**os.environ, "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}


def worker_process(redis_url, tiny_model, *extra, **popen) -> subprocess.Popen:
    """`miro worker` (worker_command) started."""
    command, env = worker_command(redis_url, tiny_model, *extra)
    return subprocess.Popen(command, env=env, **{"stderr": subprocess.DEVNULL, **popen})


def rows_written(tmp_path, batch_id) -> int:
    return read_parts(str(tmp_path / "out"), batch_id).num_rows


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def run_worker(conn, tiny_model, **engine) -> BatchWorker:
    worker = BatchWorker(
        [Queue(queue_for(tiny_model), connection=conn, serializer=JSONSerializer)],
        connection=conn,
        serializer=JSONSerializer,
        model=tiny_model,
        engine_options={"kv_cache_memory": "4MiB", "max_num_seqs": 4, **engine},
    )
    worker.work(burst=True, logging_level="WARNING")
    return worker
