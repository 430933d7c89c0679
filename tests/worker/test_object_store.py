"""An object store as the fleet's storage, against a real S3-compatible server (SeaweedFS, tests/s3_server.py):
workers write part files to s3://bucket/prefix, `miro results` merges them from there (to a local file or back
to the store, Parquet or OpenAI JSONL), `miro run -o s3://...` writes its results there."""

import json

import pyarrow.parquet as pq
import redis
import s3_server
from click.testing import CliRunner
from rq.serializers import JSONSerializer

from miro.cli.main import cli
from miro.worker import BatchWorker
from miro.worker.fleet.records import batches
from miro.worker.fleet.intake.routing import queue_for

s3_endpoint, s3 = s3_server.s3_endpoint, s3_server.s3  # the fixtures, for this module's tests

LINES = [
    {"id": f"q{i}", "prompt": f"hello {i}", "max_tokens": 3, "temperature": 0, "ignore_eos": True} for i in range(4)
] + [{"id": "long", "prompt": "hello " * 200, "max_tokens": 2}]  # over the context


def dataset(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in LINES))
    return str(path)


def cli_ok(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


def run_batch(tmp_path, redis_url, tiny_model, output) -> str:
    batch_id = cli_ok(
        "submit", dataset(tmp_path), "--redis-url", redis_url, "--model", tiny_model, "--output", output
    ).stdout.strip()
    conn = redis.Redis.from_url(redis_url)
    BatchWorker(
        [queue_for(tiny_model)],
        connection=conn,
        serializer=JSONSerializer,
        model=tiny_model,
        engine_options={"kv_cache_memory": "4MiB"},
        flush_rows=2,
    ).work(burst=True)
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.completed, record.failed) == ("completed", 4, 1)
    return batch_id


def test_workers_write_part_files_to_the_store_and_results_merge_them_from_there(tmp_path, redis_url, tiny_model, s3):
    batch_id = run_batch(tmp_path, redis_url, tiny_model, s3.url("runs"))
    files = s3.files(f"runs/{batch_id}")
    assert "_requests/0000000.jsonl" in files  # the submitted requests are stored beside the part files
    assert "_counted.jsonl" in files  # the ended batch's counted requests went there too (counted.py)
    parts = [f for f in files if not f.startswith("_")]
    assert parts and all(p.startswith("part-") and p.endswith(".parquet") for p in parts)  # no temporary left

    cli_ok("results", batch_id, "-o", tmp_path / "merged.parquet", "--redis-url", redis_url)
    rows = pq.read_table(tmp_path / "merged.parquet").to_pylist()
    assert [r["custom_id"] for r in rows] == ["q0", "q1", "q2", "q3", "long"]
    assert [r["completion_tokens"] for r in rows[:4]] == [3] * 4 and "context length" in rows[4]["error"]

    cli_ok("results", batch_id, "-o", s3.url("merged/results.parquet"), "--redis-url", redis_url)
    stored = pq.read_table(f"{s3.bucket}/merged/results.parquet", filesystem=s3.filesystem()).to_pylist()
    assert stored == rows
    cli_ok("results", batch_id, "--format", "jsonl", "-o", s3.url("merged/out.jsonl"), "--redis-url", redis_url)
    assert s3.files("merged") == ["out.errors.jsonl", "out.jsonl", "results.parquet"]
    with s3.filesystem().open_input_stream(f"{s3.bucket}/merged/out.jsonl") as f:
        assert [json.loads(line)["custom_id"] for line in f.read().decode().splitlines()] == ["q0", "q1", "q2", "q3"]


def test_aws_endpoint_url_names_the_server_for_plain_s3_urls(tmp_path, redis_url, tiny_model, s3, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{s3.endpoint}")
    batch_id = run_batch(tmp_path, redis_url, tiny_model, f"s3://{s3.bucket}/plain")
    assert s3.files(f"plain/{batch_id}")
    cli_ok("results", batch_id, "-o", tmp_path / "merged.parquet", "--redis-url", redis_url)
    assert pq.read_table(tmp_path / "merged.parquet").num_rows == 5


def test_miro_run_writes_its_results_to_the_store(tmp_path, tiny_model, s3, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli_ok(
        "run",
        dataset(tmp_path),
        "-o",
        s3.url("run/results.parquet"),
        "--model",
        tiny_model,
        "--kv-cache-memory",
        "4MiB",
        "--skip-invalid",
    )
    assert s3.files("run") == ["results.parquet"]
    rows = pq.read_table(f"{s3.bucket}/run/results.parquet", filesystem=s3.filesystem()).to_pylist()
    assert [r["custom_id"] for r in rows] == ["q0", "q1", "q2", "q3", "long"]
    assert not (tmp_path / "results.parquet.miro-run").exists()  # its local state folder, removed once done
