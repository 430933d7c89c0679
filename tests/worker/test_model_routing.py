"""A batch runs on the model it names, and only workers of that model take its jobs; an unknown model is refused
at submit. Real redis-server, real BatchWorkers and `miro worker` processes on two tiny GGUF models."""

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import redis
from click.testing import CliRunner
from gguf_factory import write_tiny_llama
from rq import Queue
from rq.serializers import JSONSerializer

from miro.cli.main import cli
from miro.worker import BatchWorker
from miro.worker.fleet.records import batches
from miro.worker.fleet.output.results import read_parts
from miro.worker.fleet.intake.routing import model_name, queue_for


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    return [
        str(write_tiny_llama(folder / f"tiny-{x}.gguf", tensor_type="Q8_0", seed=seed)["path"])
        for x, seed in (("a", 1), ("b", 2))
    ]


def write_lines(path, lines) -> str:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def openai_line(custom_id: str, model: str) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": model, "prompt": f"hello {custom_id}", "max_tokens": 4, "temperature": 0},
    }


def submit(tmp_path, redis_url, lines, *options):
    dataset = write_lines(tmp_path / "d.jsonl", lines)
    return CliRunner().invoke(
        cli, ["submit", dataset, "--redis-url", redis_url, "--output", str(tmp_path / "out"), *options]
    )


def run_worker(conn, model, queues=None, **options) -> BatchWorker:
    queues = queues or [queue_for(model)]
    worker = BatchWorker(
        [Queue(q, connection=conn, serializer=JSONSerializer) for q in queues],
        connection=conn,
        serializer=JSONSerializer,
        model=model,
        flush_rows=1,
        engine_options={"kv_cache_memory": "4MiB", "max_num_seqs": 4},
        **options,
    )
    worker.work(burst=True, logging_level="WARNING")
    return worker


def rows_by_id(tmp_path, batch_id) -> dict[str, dict]:
    return {r["custom_id"]: r for r in read_parts(str(tmp_path / "out"), batch_id).to_pylist()}


def test_an_unknown_model_is_refused_at_submit_and_nothing_is_enqueued(tmp_path, redis_url):
    result = submit(tmp_path, redis_url, [{"id": "a", "prompt": "hi"}], "--model", "no-such-model")
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 2 and result.stderr.splitlines()[-1].startswith(
        "Error: The model 'no-such-model' is unknown: it is not an alias"
    )
    assert redis.Redis.from_url(redis_url).dbsize() == 0


def test_a_foreign_model_in_the_lines_needs_an_explicit_model(tmp_path, redis_url, two_models):
    lines = [openai_line("c1", "gpt-4o-mini"), openai_line("c2", "gpt-4o-mini")]
    refused = submit(tmp_path, redis_url, lines)
    assert refused.exit_code == 1
    assert "Line 1: model 'gpt-4o-mini' is unknown" in refused.stderr and "pass --model" in refused.stderr
    assert redis.Redis.from_url(redis_url).dbsize() == 0

    model_a = two_models[0]
    accepted = submit(tmp_path, redis_url, lines, "--model", model_a)
    assert accepted.exit_code == 0, accepted.output
    batch_id = accepted.stdout.strip()
    conn = redis.Redis.from_url(redis_url)
    run_worker(conn, model_a)
    rows = rows_by_id(tmp_path, batch_id)
    assert {(r["model"], r["requested_model"], r["error"]) for r in rows.values()} == {("tiny-a", "gpt-4o-mini", None)}
    out = tmp_path / "out.jsonl"
    merged = CliRunner().invoke(
        cli, ["results", batch_id, "-o", str(out), "--format", "jsonl", "--redis-url", redis_url]
    )
    assert merged.exit_code == 0, merged.output
    assert {json.loads(line)["response"]["body"]["model"] for line in out.read_text().splitlines()} == {"tiny-a"}


def test_a_dry_run_notes_a_model_only_redis_could_know(tmp_path):
    dataset = write_lines(tmp_path / "d.jsonl", [openai_line("c1", "gpt-4o-mini")])
    result = CliRunner().invoke(cli, ["submit", dataset, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "Note: model 'gpt-4o-mini' is no alias and no .gguf file here" in result.stderr


def test_lines_naming_two_models_are_refused(tmp_path, redis_url):
    result = submit(tmp_path, redis_url, [openai_line("c1", "smollm2-135m"), openai_line("c2", "gemma3-270m")])
    assert result.exit_code == 1
    assert "The lines name 2 models ('smollm2-135m' (line 1), 'gemma3-270m' (line 2))" in result.stderr


def test_lines_naming_many_models_are_refused_naming_the_first_few(tmp_path, redis_url):
    """Only the first models named are remembered (a file could name one per line): the rest make it "more than"."""
    result = submit(tmp_path, redis_url, [openai_line(f"c{i}", f"model-{i}") for i in range(1, 9)])
    assert result.exit_code == 1
    assert (
        "The lines name more than 5 models ('model-1' (line 1), 'model-2' (line 2), 'model-3' (line 3), "
        "'model-4' (line 4), 'model-5' (line 5), ...), and a batch runs on one"
    ) in result.stderr


def test_two_models_two_workers_each_request_runs_on_its_own_model(tmp_path, redis_url, two_models):
    conn = redis.Redis.from_url(redis_url)
    batch_ids = {}
    for model in two_models:
        lines = [
            {"id": f"{model_name(model)}-{i}", "prompt": f"hello {i}", "max_tokens": 5, "temperature": 0}
            for i in range(6)
        ]
        result = submit(tmp_path, redis_url, lines, "--model", model)
        assert result.exit_code == 0, result.output
        batch_ids[model] = result.stdout.strip()
    assert batches.get_batch(conn, batch_ids[two_models[0]]).queue == "miro:tiny-a"

    worker_a = run_worker(conn, two_models[0])  # burst: takes all it serves, leaves the rest queued
    assert batches.get_batch(conn, batch_ids[two_models[0]]).status == "completed"
    assert batches.get_batch(conn, batch_ids[two_models[1]]).completed == 0
    worker_b = run_worker(conn, two_models[1])
    for model, worker in zip(two_models, (worker_a, worker_b)):
        rows = rows_by_id(tmp_path, batch_ids[model])
        assert len(rows) == 6
        assert {(r["model"], r["worker"], r["error"]) for r in rows.values()} == {
            (model_name(model), worker.name, None)
        }


def test_a_job_on_a_queue_of_another_model_fails_with_a_sentence_and_retry_runs_it_right(
    tmp_path, redis_url, two_models
):
    model_a, model_b = two_models
    result = submit(tmp_path, redis_url, [{"id": "x", "prompt": "hello", "max_tokens": 3}], "--model", model_a)
    batch_id = result.stdout.strip()
    conn = redis.Redis.from_url(redis_url)
    wrong = run_worker(conn, model_b, queues=[queue_for(model_a)])  # told by --queue to serve A's queue
    record = batches.get_batch(conn, batch_id)
    assert (record.status, record.failed) == ("completed", 1)
    error = rows_by_id(tmp_path, batch_id)["x"]["error"]
    assert error == (
        f"this request is for model 'tiny-a', but worker {wrong.name} serves 'tiny-b': start a worker "
        f"for 'tiny-a' and run `miro retry {batch_id}`"
    )

    assert CliRunner().invoke(cli, ["retry", batch_id, "--redis-url", redis_url]).stdout == "1\n"
    run_worker(conn, model_a)
    merged = CliRunner().invoke(cli, ["results", batch_id, "-o", str(tmp_path / "m.parquet"), "--redis-url", redis_url])
    assert merged.exit_code == 0
    [row] = pq.read_table(tmp_path / "m.parquet").to_pylist()
    assert row["error"] is None and row["model"] == "tiny-a"


def test_a_served_model_name_maps_a_foreign_model_to_a_worker(tmp_path, redis_url, two_models):
    """`miro worker --served-model-name gpt-4o-mini` tells the fleet that name: lines asking for it are then
    accepted without --model, and run on that worker's model."""
    model_a = two_models[0]
    command = [
        sys.executable,
        "-c",
        "from miro.cli.main import cli; cli()",
        "worker",
        "--redis-url",
        redis_url,
        "--model",
        model_a,
        "--served-model-name",
        "gpt-4o-mini",
        "--kv-cache-memory",
        "4MiB",
        "--flush-rows",
        "1",
        "--burst",
    ]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)  # nothing queued yet
    assert first.returncode == 0, first.stderr

    result = submit(tmp_path, redis_url, [openai_line("c1", "gpt-4o-mini")])
    assert result.exit_code == 0, result.output
    batch_id = result.stdout.strip()
    assert batches.get_batch(redis.Redis.from_url(redis_url), batch_id).queue == "miro:gpt-4o-mini"
    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    row = rows_by_id(tmp_path, batch_id)["c1"]
    assert (row["model"], row["requested_model"], row["error"]) == ("tiny-a", "gpt-4o-mini", None)
