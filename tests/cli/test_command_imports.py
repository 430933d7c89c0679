"""The commands that only talk to Redis start without numba and the engine: `miro submit` (and miro-submit),
status, watch, cancel, retry and results, each run as a real process against a real Redis."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import sys
from miro.cli.main import cli
try:
    cli(sys.argv[1:], prog_name="miro")
except SystemExit as e:
    code = e.code
else:
    code = 0
heavy = [m for m in ("numba", "miro.core.engine.engine", "miro.core.layers.pointwise") if m in sys.modules]
print("IMPORTED", code, ",".join(heavy), file=sys.stderr)
"""


def run(*args: str) -> tuple[int, list[str], str]:
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120)
    last = done.stderr.strip().splitlines()[-1].split(" ")
    assert last[0] == "IMPORTED", done.stderr
    return int(last[1]), [m for m in (last[2] if len(last) > 2 else "").split(",") if m], done.stdout


@pytest.fixture
def batch(tmp_path, redis_url):
    dataset = tmp_path / "d.jsonl"
    dataset.write_text("".join(json.dumps({"id": f"q{i}", "prompt": "hi"}) + "\n" for i in range(3)))
    code, heavy, out = run("submit", str(dataset), "--redis-url", redis_url, "--output", str(tmp_path / "out"))
    assert code == 0 and heavy == [], heavy
    return out.strip()


def test_submit_dry_run_and_watch_with_nothing_active(tmp_path, redis_url):
    dataset = tmp_path / "d.jsonl"
    dataset.write_text('{"id": "q", "prompt": "hi"}\n')
    assert run("submit", str(dataset), "--dry-run") == (0, [], "")
    code, heavy, _ = run("watch", "--redis-url", redis_url)
    assert (code, heavy) == (0, [])


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["status", "{batch}", "--json"],
        ["results", "{batch}", "-o", "{out}"],
        ["cancel", "{batch}"],
        ["retry", "{batch}"],
    ],
)
def test_redis_only_commands_load_no_engine(batch, command, tmp_path, redis_url):
    args = [a.format(batch=batch, out=tmp_path / "r.parquet") for a in command]
    code, heavy, _ = run(*args, "--redis-url", redis_url)
    assert (code, heavy) == (0, [])
