"""Embeddings end to end on the real all-MiniLM-L6-v2: `miro run` as a real process (Parquet, then OpenAI lines),
`miro embed`, and a fleet of two `miro worker` processes, one killed mid-batch, that still embeds every input
exactly once."""

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from click.testing import CliRunner
from polling import kill_one_of_two_workers

from miro.cli.main import cli
from miro.core import Engine
from miro.core.layers.pooling import PoolingParams
from miro.worker.fleet.records import batches

MODEL = "all-minilm-l6-v2"
MIRO = [sys.executable, "-c", "from miro.cli.main import cli; cli()"]
ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
TEXTS = [
    "Offline batch inference on CPUs.",
    "A search index needs a vector per passage.",
    "Deduplication compares embeddings.",
]


def write(path, lines) -> str:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def test_miro_run_embeds_a_dataset_into_parquet_and_openai_lines(tmp_path, minilm_path):
    lines = [
        {"id": "s", "input": TEXTS[0], "source": "docs"},
        {"id": "l", "input": TEXTS[1:], "source": "faq"},
        {"custom_id": "o", "method": "POST", "url": "/v1/embeddings", "body": {"input": TEXTS[2]}},
        {"id": "blank", "input": ""},
    ]
    dataset = write(tmp_path / "corpus.jsonl", lines)
    out = tmp_path / "vectors.parquet"
    # no --model: an embedding dataset runs on the embedding model; stderr is no terminal, so progress is plain lines
    done = subprocess.run(
        [*MIRO, "run", dataset, "-o", str(out), "--skip-invalid"], capture_output=True, text=True, env=ENV, timeout=300
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "line 4: field 'input': input 0 is an empty string." in done.stderr
    assert "/4 done" in done.stderr and "Embedded 3 requests in " in done.stderr
    assert f"Wrote 5 rows to {out}: 3 completed, 1 failed" in done.stderr and "tokens embedded" in done.stderr
    table = pq.read_table(out)
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 384)
    rows = table.to_pylist()
    assert [(r["custom_id"], r["input_index"], r["source"]) for r in rows] == [
        ("s", 0, "docs"),
        ("l", 0, "faq"),
        ("l", 1, "faq"),
        ("o", 0, None),
        ("blank", None, None),
    ]
    expected = Engine.from_model(MODEL).embed(TEXTS)
    np.testing.assert_allclose([rows[0]["embedding"], rows[1]["embedding"], rows[2]["embedding"]], expected, atol=1e-5)
    assert rows[4]["error"] == "line 4: field 'input': input 0 is an empty string."

    jsonl = tmp_path / "vectors.jsonl"
    again = subprocess.run(
        [*MIRO, "run", dataset, "-o", str(jsonl), "--format", "jsonl", "--skip-invalid", "--model", MODEL],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr
    bodies = {line["custom_id"]: line["response"]["body"] for line in map(json.loads, jsonl.read_text().splitlines())}
    assert sorted(bodies) == ["l", "o", "s"] and [d["index"] for d in bodies["l"]["data"]] == [0, 1]
    failed = [json.loads(line) for line in jsonl.with_suffix(".errors.jsonl").read_text().splitlines()]
    assert [line["custom_id"] for line in failed] == ["blank"]


def test_miro_run_task_embed_embeds_prompt_lines_and_truncate_cuts_long_ones(tmp_path, minilm_path):
    dataset = write(
        tmp_path / "prompts.jsonl",
        [{"id": "p", "prompt": TEXTS[0]}, {"id": "long", "prompt": "lorem ipsum dolor " * 300}],
    )
    out = tmp_path / "out.parquet"
    result = CliRunner().invoke(
        cli, ["run", dataset, "-o", str(out), "--model", MODEL, "--task", "embed", "--truncate"]
    )
    assert result.exit_code == 0, result.output
    rows = pq.read_table(out).to_pylist()
    assert [(r["custom_id"], r["error"]) for r in rows] == [("p", None), ("long", None)]
    assert rows[1]["prompt_tokens"] == 512 and json.loads(rows[1]["sampling"]) == {"truncate_prompt_tokens": -1}


def test_miro_embed_prints_a_json_array_per_text_or_writes_parquet(tmp_path, minilm_path):
    printed = CliRunner().invoke(cli, ["embed", *TEXTS[:2]])
    assert printed.exit_code == 0, printed.output
    vectors = [json.loads(line) for line in printed.stdout.splitlines()]
    expected = Engine.from_model(MODEL).embed(TEXTS[:2])
    assert np.array_equal(np.array(vectors, dtype=np.float32), expected)  # every float32 printed to read back exactly

    short = CliRunner().invoke(cli, ["embed", TEXTS[0], "--dimensions", "8"])
    assert len(json.loads(short.stdout)) == 8

    out = tmp_path / "e.parquet"
    written = CliRunner().invoke(cli, ["embed", *TEXTS, "-o", str(out), "--dimensions", "32"])
    assert written.exit_code == 0 and written.stdout == ""
    assert f"Wrote 3 embeddings of 32 dimensions to {out}." in written.stderr
    table = pq.read_table(out)
    assert table.column_names == ["input_index", "prompt", "embedding", "prompt_tokens"]
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 32)
    np.testing.assert_allclose(
        table["embedding"].to_pylist(), Engine.from_model(MODEL).embed(TEXTS, PoolingParams(dimensions=32)), atol=1e-6
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["hello", ""], "Error: text 2: the input is an empty string.\n"),
        (
            ["x " * 600],
            "Error: the input has 602 tokens, more than the model's context of 512: shorten it, or set "
            "truncate_prompt_tokens (--truncate) to cut it.\n",
        ),
        (["hello", "--dimensions", "500"], "Error: dimensions is 500, but the model's embeddings have 384.\n"),
    ],
)
def test_miro_embed_errors_are_one_sentence(minilm_path, args, message):
    result = CliRunner().invoke(cli, ["embed", *args])
    assert (result.exit_code, result.stderr) == (1, message)


def test_miro_embed_on_a_chat_model_says_it_cannot_embed(tiny_model):
    result = CliRunner().invoke(cli, ["embed", "a", "b", "--model", tiny_model, "--kv-cache-memory", "1MiB"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr.startswith(f"Error: model '{tiny_model}' cannot embed: it generates text")


@pytest.mark.slow
def test_a_worker_killed_mid_batch_loses_nothing_and_embeds_every_input_once(tmp_path, redis_url, minilm_path):
    """Two workers with short heartbeats and part files every 8 rows; one is killed once some requests are
    counted. What it held goes to the other; every custom id and input has one row, none failed or counted twice."""
    passage = "a passage about batch inference, queues and workers that go away and come back " * 4
    lines = [{"id": f"p{i}", "input": [f"{i}: {passage}", f"{i} again: {passage}"]} for i in range(60)]
    dataset = write(tmp_path / "d.jsonl", lines)
    submitted = CliRunner().invoke(
        cli, ["submit", dataset, "--redis-url", redis_url, "--output", str(tmp_path / "parts")]
    )
    assert submitted.exit_code == 0, submitted.output
    batch_id = submitted.stdout.strip()
    conn = redis.Redis.from_url(redis_url)
    assert batches.get_batch(conn, batch_id).model == MODEL  # the embedding batch's default model
    command = [
        *MIRO,
        "worker",
        "--redis-url",
        redis_url,
        "--model",
        MODEL,
        "--max-num-seqs",
        "8",
        "--job-monitoring-interval",
        "1",
        "--heartbeat-slack",
        "2",
        "--maintenance-interval",
        "1",
        "--flush-rows",
        "8",
        "--flush-seconds",
        "6",
    ]
    kill_one_of_two_workers(
        command,
        ENV,
        lambda: batches.get_batch(conn, batch_id).completed,
        lambda: batches.get_batch(conn, batch_id).status == "completed",
        total=60,
    )
    record = batches.get_batch(conn, batch_id)
    assert (record.completed, record.failed, record.total) == (60, 0, 60)
    out = tmp_path / "m.parquet"
    merged = CliRunner().invoke(cli, ["results", batch_id, "-o", str(out), "--redis-url", redis_url])
    assert merged.exit_code == 0, merged.output
    rows = pq.read_table(out).to_pylist()
    assert [(r["custom_id"], r["input_index"]) for r in rows] == [(f"p{i}", k) for i in range(60) for k in (0, 1)]
    assert all(r["error"] is None and len(r["embedding"]) == 384 for r in rows)
