"""Embedding batches through miro submit, a worker and miro results, on a real redis-server and the real
all-MiniLM-L6-v2: a row per input with its vector and the line's own columns; OpenAI output lines that the
openai SDK's CreateEmbeddingResponse reads, in floats or base64; an over-long input, a generation line sent to
the embedding model and the reverse, each its own line's error."""

import base64
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from click.testing import CliRunner
from openai.types import CreateEmbeddingResponse
from rq import Queue, SimpleWorker
from rq.serializers import JSONSerializer

from miro.cli.main import cli
from miro.core import Engine
from miro.core.layers.pooling import PoolingParams
from miro.worker import BatchWorker
from miro.worker.fleet.records import batches
from miro.worker.fleet.intake.routing import queue_for

MODEL = "all-minilm-l6-v2"
LONG = "the quick brown fox jumps over the lazy dog " * 60  # about 540 tokens: over MiniLM's 512


@pytest.fixture(scope="module")
def engine(minilm_path):
    """The embedding model in this process, for the vectors the batches should give."""
    return Engine.from_model(MODEL)


class Batch:
    """A dataset submitted to one model's queue and run by one worker in burst mode."""

    def __init__(self, tmp_path, redis_url, lines, model=MODEL, *submit_args, worker="batch"):
        tmp_path.mkdir(exist_ok=True)
        dataset = tmp_path / "d.jsonl"
        dataset.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
        self.tmp_path, self.redis_url = tmp_path, redis_url
        self.conn = redis.Redis.from_url(redis_url)
        submitted = CliRunner().invoke(
            cli,
            [
                "submit",
                str(dataset),
                "--redis-url",
                redis_url,
                "--model",
                model,
                "--output",
                str(tmp_path / "parts"),
                *submit_args,
            ],
        )
        assert submitted.exit_code == 0, submitted.output
        self.id = submitted.stdout.strip()
        queue = Queue(queue_for(model), connection=self.conn, serializer=JSONSerializer)
        if worker == "simple":  # RQ's own worker, running miro.worker.jobs.generate
            SimpleWorker([queue], connection=self.conn, serializer=JSONSerializer).work(burst=True)
        else:
            BatchWorker(
                [queue],
                connection=self.conn,
                serializer=JSONSerializer,
                model=model,
                flush_rows=2,
                engine_options={"kv_cache_memory": "4MiB"},
            ).work(burst=True, logging_level="WARNING")
        self.record = batches.get_batch(self.conn, self.id)

    def results(self, fmt="parquet"):
        out = self.tmp_path / f"results.{fmt}"
        merged = CliRunner().invoke(
            cli, ["results", self.id, "-o", str(out), "--format", fmt, "--redis-url", self.redis_url]
        )
        assert merged.exit_code == 0, merged.output
        if fmt == "parquet":
            return pq.read_table(out)
        errors = out.with_suffix(".errors.jsonl")
        return (
            [json.loads(line) for line in out.read_text().splitlines()],
            [json.loads(line) for line in errors.read_text().splitlines()],
        )


EMBEDDING_COLUMNS = [
    ("batch_id", pa.string()),
    ("custom_id", pa.string()),
    ("line", pa.int32()),
    ("input_index", pa.int32()),
    ("kind", pa.string()),
    ("job_id", pa.string()),
    ("model", pa.string()),
    ("requested_model", pa.string()),
    ("prompt", pa.string()),
    ("embedding", pa.list_(pa.float32(), 384)),
    ("encoding_format", pa.string()),
    ("prompt_tokens", pa.int32()),
    ("error", pa.string()),
    ("error_code", pa.string()),
    ("worker", pa.string()),
    ("started_at", pa.timestamp("ms", tz="UTC")),
    ("finished_at", pa.timestamp("ms", tz="UTC")),
    ("latency_s", pa.float64()),
    ("sampling", pa.string()),
    ("request_hash", pa.string()),  # what --reuse keys a row by (output/fingerprint.py)
    ("model_sha256", pa.string()),
    ("reused_from", pa.string()),
    ("topic", pa.string()),
]


def test_each_input_form_gives_a_row_per_input_with_its_vector_and_the_lines_own_columns(tmp_path, redis_url, engine):
    ids = engine.tokenizer.encode("token ids in", special=True, add_special=True)
    lines = [
        {"id": "one", "input": "A sentence to embed.", "topic": "a"},
        {"id": "many", "input": ["first of two", "second of two"], "topic": "b"},
        {"id": "ids", "input": ids},
        {"id": "id-lists", "input": [ids, ids[:2]], "topic": "c"},
    ]
    batch = Batch(tmp_path, redis_url, lines)
    assert (batch.record.status, batch.record.task, batch.record.completed, batch.record.failed) == (
        "completed",
        "embed",
        4,
        0,
    )
    table = batch.results()
    assert [(f.name, f.type) for f in table.schema] == EMBEDDING_COLUMNS
    rows = table.to_pylist()
    assert [(r["custom_id"], r["input_index"], r["topic"]) for r in rows] == [
        ("one", 0, "a"),
        ("many", 0, "b"),
        ("many", 1, "b"),
        ("ids", 0, None),
        ("id-lists", 0, "c"),
        ("id-lists", 1, "c"),
    ]
    inputs = ["A sentence to embed.", "first of two", "second of two", ids, ids, ids[:2]]
    expected = engine.encode(inputs)
    vectors = np.array([r["embedding"] for r in rows], dtype=np.float32)
    np.testing.assert_allclose(vectors, np.stack([out.embedding for out in expected]), atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert [r["prompt_tokens"] for r in rows] == [out.num_tokens for out in expected]
    assert [r["prompt"] for r in rows] == [*inputs[:3], None, None, None]
    assert all(r["error"] is None and r["kind"] == "embedding" and r["model"] == MODEL for r in rows)
    assert batch.record.prompt_tokens == sum(out.num_tokens for out in expected)


def test_openai_lines_come_back_as_the_sdks_create_embedding_response_in_floats_or_base64(tmp_path, redis_url, engine):
    texts = ["Embeddings for search.", "And for clustering."]
    lines = [
        {
            "custom_id": fmt,
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": MODEL, "input": texts, "encoding_format": fmt},
        }
        for fmt in ("float", "base64")
    ]
    lines.append(
        {
            "custom_id": "short",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": MODEL, "input": texts[0], "dimensions": 8},
        }
    )
    batch = Batch(tmp_path, redis_url, lines, MODEL)
    responses, errors = batch.results("jsonl")
    assert errors == [] and [line["custom_id"] for line in responses] == ["float", "base64", "short"]
    for line in responses:
        assert line["error"] is None and line["response"]["status_code"] == 200
        assert line["id"] == f"batch_req_{line['response']['request_id']}"
    floats, encoded, short = (line["response"]["body"] for line in responses)
    response = CreateEmbeddingResponse.model_validate(floats)
    assert (response.object, response.model, [d.index for d in response.data]) == ("list", MODEL, [0, 1])
    tokens = sum(out.num_tokens for out in engine.encode(texts))
    assert (response.usage.prompt_tokens, response.usage.total_tokens) == (tokens, tokens)
    np.testing.assert_allclose(np.array([d.embedding for d in response.data]), engine.embed(texts), atol=1e-5)
    # base64: the little-endian float32 bytes of the same vectors, as the SDK decodes them
    assert all(isinstance(d["embedding"], str) for d in encoded["data"])
    decoded = {
        **encoded,
        "data": [
            {**d, "embedding": np.frombuffer(base64.b64decode(d["embedding"]), "<f4").tolist()} for d in encoded["data"]
        ],
    }
    assert CreateEmbeddingResponse.model_validate(decoded).data == response.data
    short_response = CreateEmbeddingResponse.model_validate(short)
    np.testing.assert_allclose(
        short_response.data[0].embedding, engine.embed([texts[0]], PoolingParams(dimensions=8))[0], atol=1e-5
    )
    # lines asked for 384 and for 8 dimensions: the Parquet column holds vectors of either size
    table = batch.results()
    assert table.schema.field("embedding").type == pa.list_(pa.float32())
    assert [len(v) for v in table["embedding"].to_pylist()] == [384, 384, 384, 384, 8]


def test_an_over_long_input_is_its_lines_error_unless_truncated(tmp_path, redis_url):
    lines = [
        {"id": "fine", "input": "short"},
        {"id": "long", "input": ["short too", LONG]},
        {"id": "cut", "input": LONG, "truncate_prompt_tokens": 16},
    ]
    batch = Batch(tmp_path, redis_url, lines)
    assert (batch.record.completed, batch.record.failed) == (2, 1)
    rows = {(r["custom_id"], r["input_index"]): r for r in batch.results().to_pylist()}
    assert sorted(rows) == [("cut", 0), ("fine", 0), ("long", None)]
    assert rows[("long", None)]["error"].startswith("input 1: the input has ")
    assert "more than the model's context of 512" in rows[("long", None)]["error"]
    assert rows[("cut", 0)]["prompt_tokens"] == 16 and rows[("fine", 0)]["error"] is None

    truncated = Batch(tmp_path / "again", redis_url, lines, MODEL, "--truncate")
    assert (truncated.record.completed, truncated.record.failed) == (3, 0)
    tokens = {(r["custom_id"], r["input_index"]): r["prompt_tokens"] for r in truncated.results().to_pylist()}
    assert tokens[("long", 1)] == 512 and tokens[("cut", 0)] == 16  # a line's own truncation wins over --truncate


def test_a_generation_line_on_the_embedding_model_and_an_embedding_line_on_a_chat_model_fail_naming_the_model(
    tmp_path, redis_url, tiny_model
):
    generation = [{"id": "p", "prompt": "hello"}, {"id": "c", "messages": [{"role": "user", "content": "hi"}]}]
    on_embedder = Batch(tmp_path / "a", redis_url, generation)
    assert (on_embedder.record.completed, on_embedder.record.failed) == (0, 2)
    table = on_embedder.results()
    assert "embedding" not in table.column_names and "output" in table.column_names  # a generation batch's columns
    assert (
        table["error"].to_pylist()
        == [
            f"model '{MODEL}' is an embedding model: it embeds text (/v1/embeddings, "
            "PoolingParams) and cannot generate it."
        ]
        * 2
    )

    on_generator = Batch(tmp_path / "b", redis_url, [{"id": "e", "input": ["a", "b"]}], tiny_model)
    assert (on_generator.record.completed, on_generator.record.failed) == (0, 1)
    [row] = on_generator.results().to_pylist()
    assert row["input_index"] is None and row["embedding"] is None
    assert row["error"].startswith(f"model '{tiny_model}' cannot embed: it generates text")


def test_rqs_own_worker_runs_an_embedding_job(tmp_path, redis_url, minilm_path, engine, rq_command_poll):
    batch = Batch(
        tmp_path,
        redis_url,
        [{"id": "s", "input": ["one", "two"], "dimensions": 16}, {"id": "bad", "input": LONG}],
        MODEL,
        worker="simple",
    )
    assert (batch.record.completed, batch.record.failed) == (1, 1)
    rows = batch.results().to_pylist()
    assert [(r["custom_id"], r["input_index"]) for r in rows] == [("s", 0), ("s", 1), ("bad", None)]
    np.testing.assert_allclose(
        [r["embedding"] for r in rows[:2]], engine.embed(["one", "two"], PoolingParams(dimensions=16)), atol=1e-5
    )
    assert "more than the model's context of 512" in rows[2]["error"]
