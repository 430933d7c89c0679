"""`miro run` with issue 37's poisoned lines among good ones: no traceback, every good line's result written, each
bad line an error row, exit status 0 (a run whose requests failed still completes, as for any failed request);
`--resume` the same. Real `miro run` (a process, or in this process with the checks that refuse the lines up front
turned off, so the engine's step meets them), its embedded redis-server, the tiny GGUF model."""

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
from click.testing import CliRunner

from miro.cli import run as run_module
from miro.cli.main import cli

ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
STOP_ID = {"id": "stop-id", "prompt": "hello", "min_tokens": 1, "stop_token_ids": [49152], "max_tokens": 4}
GRAMMAR = {"id": "grammar", "prompt": "hello", "max_tokens": 4, "structured_outputs": {"grammar": 'start: "a"{60000}'}}


def dataset(tmp_path, poison: list[dict]):
    lines = [{"id": f"g{i}", "prompt": f"hello {i}", "max_tokens": 3} for i in range(6)]
    lines[2:2] = poison
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def results(out) -> dict[str, dict]:
    return {row["custom_id"]: row for row in pq.read_table(out).to_pylist()}


def test_a_run_with_the_poisoned_lines_writes_every_good_line_and_an_error_row_for_each_bad_one(tmp_path, tiny_model):
    path, out = dataset(tmp_path, [STOP_ID, GRAMMAR]), tmp_path / "r.parquet"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from miro.cli.main import cli; cli()",
            "run",
            str(path),
            "-o",
            str(out),
            "--model",
            tiny_model,
            "--kv-cache-memory",
            "8MiB",
            "--skip-invalid",
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    rows = results(out)
    assert sorted(rows) == sorted(["grammar", "stop-id", *(f"g{i}" for i in range(6))])
    assert all(rows[f"g{i}"]["error"] is None and rows[f"g{i}"]["output"] is not None for i in range(6))
    assert "outside the model's vocabulary" in rows["stop-id"]["error"]
    assert "structured_outputs.grammar cannot run" in rows["grammar"]["error"]  # refused as the line was read
    assert "6 completed, 2 failed" in done.stderr, done.stderr  # the invalid line is counted failed too


def run(path, out, tiny_model, *extra):
    return CliRunner().invoke(
        cli, ["run", str(path), "-o", str(out), "--model", tiny_model, "--kv-cache-memory", "8MiB", *extra]
    )


def assert_poison_failed_alone(result, out):
    assert result.exit_code == 0 and result.exception is None, result.output
    rows = results(out)
    assert len(rows) == 8 and all(rows[f"g{i}"]["error"] is None for i in range(6))
    assert "IndexError" in rows["stop-id"]["error"] and "sampling" in rows["stop-id"]["error"]
    assert "Too many items" in rows["grammar"]["error"]
    assert "6 completed, 2 failed" in result.output


def test_unchecked_the_engine_fails_the_poisoned_lines_alone_in_a_run_and_its_resume(
    tmp_path, tiny_model, unchecked, monkeypatch
):
    path = dataset(tmp_path, [STOP_ID, GRAMMAR])
    assert_poison_failed_alone(run(path, tmp_path / "a.parquet", tiny_model), tmp_path / "a.parquet")

    out, work = tmp_path / "b.parquet", run_module._work
    monkeypatch.setattr(run_module, "_work", lambda *args: None)  # a run stopped before its worker ran anything
    stopped = run(path, out, tiny_model)
    assert stopped.exit_code == 1 and "Stopped after 0 of 8 requests" in stopped.output, stopped.output
    monkeypatch.setattr(run_module, "_work", work)
    assert_poison_failed_alone(run(path, out, tiny_model, "--resume"), out)
