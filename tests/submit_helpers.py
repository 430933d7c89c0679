"""Datasets, the CLI and Redis handles for the tests of miro-submit against a real redis-server (test_submit.py,
test_submit_invalid.py)."""

import json
import re
from pathlib import Path

import redis
from click.testing import CliRunner
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from miro.cli.main import cli
from miro.worker.fleet.records import batches

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
BATCH_ID = re.compile(r"batch_[0-9a-f]{24}")

GOOD = {"id": "ok", "prompt": "fine"}


def write(path: Path, *lines) -> Path:
    """Write lines (dict -> JSON, str as is, bytes as is), one per line."""
    path.write_bytes(
        b"".join(
            (line if isinstance(line, bytes) else (json.dumps(line) if isinstance(line, dict) else line).encode())
            + b"\n"
            for line in lines
        )
    )
    return path


def openai(custom_id, url=CHAT, method="POST", **body):
    if "messages" not in body and "prompt" not in body:
        body = {**({"messages": [{"role": "user", "content": "hi"}]} if url == CHAT else {"prompt": "hi"}), **body}
    return {"custom_id": custom_id, "method": method, "url": url, "body": body}


def run(*args, env=None):
    return CliRunner().invoke(cli, [str(a) for a in args], env=env)


def conn_for(url) -> redis.Redis:
    return redis.Redis.from_url(url)


def queue(conn, name="miro:smollm2-135m") -> Queue:  # the default model's queue
    return Queue(name, connection=conn, serializer=JSONSerializer)


def job_of(conn, batch_id, custom_id) -> Job:
    return Job.fetch(batches.job_id(batch_id, custom_id), connection=conn, serializer=JSONSerializer)
