"""`miro run --completion-window`: a real `miro run` process (its embedded redis-server, its one worker) on the tiny
model with a 4,096-token context, whose window ends mid-run: the results hold what finished and a batch_expired
error row for the rest, and it says so in one sentence and exits 1; a window that is no duration is refused."""

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from gguf_factory import write_tiny_llama

ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory) -> str:
    return str(
        write_tiny_llama(tmp_path_factory.mktemp("m") / "tiny-long.gguf", tensor_type="Q8_0", context_length=4096)[
            "path"
        ]
    )


@pytest.mark.slow
def test_a_run_past_its_window_writes_what_finished_and_the_expired_rest(tmp_path, long_context_model):
    dataset = tmp_path / "d.jsonl"
    requests = [{"id": "s0", "prompt": "hi", "max_tokens": 2}, {"id": "s1", "prompt": "hey", "max_tokens": 2}]
    requests += [{"id": f"l{i}", "prompt": f"hello {i}", "max_tokens": 4000, "ignore_eos": True} for i in range(30)]
    dataset.write_text("".join(json.dumps(r) + "\n" for r in requests))
    out = tmp_path / "results.parquet"
    command = [
        sys.executable,
        "-c",
        "from miro.cli.main import cli; cli()",
        "run",
        str(dataset),
        "-o",
        str(out),
        "--model",
        long_context_model,
        "--kv-cache-memory",
        "64MiB",
        "--max-num-seqs",
        "2",
        "--flush-seconds",
        "0.2",
    ]
    ran = subprocess.run([*command, "--completion-window", "15s"], capture_output=True, text=True, env=ENV, timeout=300)
    assert ran.returncode == 1 and "Traceback" not in ran.stderr, ran.stderr
    assert "expired: its completion window (15s) ended with" in ran.stderr
    assert "those as batch_expired errors; run the same command with --resume" in ran.stderr
    rows = {r["custom_id"]: r for r in pq.read_table(out).to_pylist()}
    assert set(rows) == {r["id"] for r in requests}
    finished = [cid for cid, r in rows.items() if r["error"] is None]
    expired = [cid for cid, r in rows.items() if r["error_code"] == "batch_expired"]
    assert {"s0", "s1"} <= set(finished) and len(expired) >= 2 and len(finished) + len(expired) == len(requests)

    bad = subprocess.run(
        [*command, "--completion-window", "soon", "--state-dir", str(tmp_path / "other")],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )
    assert bad.returncode == 1 and bad.stderr.strip().endswith(
        "Error: The completion window 'soon' is not valid: give a duration such as 24h (OpenAI's), 30m, 90s or 2d."
    )
