"""--reuse's decisions against a real redis-server, over earlier results written here (no model): what is reused
and what runs, a batch wholly reused completing with no worker, and the index's keys."""

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from miro.core.errors import MiroError
from miro.worker.fleet.intake.dataset import parse_dataset
from miro.worker.fleet.intake.reuse import OtherModel, PreviousResults, ReuseSource
from miro.worker.fleet.intake.submit import submit
from miro.worker.fleet.output import fingerprint
from miro.worker.fleet.output.fingerprint import OutputStamp
from miro.worker.fleet.output.results import collect, write_parquet
from miro.worker.fleet.output.rows import SCHEMA
from miro.worker.fleet.records import batches, keys

STAMP = OutputStamp("ab" * 32, fingerprint.settings_text("native", "float16", 2048, True))
MODEL = "smollm2-135m"


def write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def earlier_results(path: Path, dataset: Path, stamp=STAMP, finish="length", error_on=()) -> Path:
    """Results as a run of `dataset` would have written them: a row per choice, hashed by `stamp`."""
    rows = []
    for request in parse_dataset(dataset).requests:
        for choice in range(request.sampling.get("n") or 1):
            failed = request.custom_id in error_on
            rows.append(
                {
                    "batch_id": "batch_" + "0" * 24,
                    "custom_id": request.custom_id,
                    "line": request.line,
                    "choice_index": choice,
                    "kind": request.kind,
                    "model": MODEL,
                    "requested_model": MODEL,
                    "prompt": request.prompt,
                    "output": None if failed else f"out {request.custom_id} {choice}",
                    "finish_reason": None if failed else finish,
                    "prompt_tokens": 3,
                    "cached_tokens": 0,
                    "completion_tokens": 2,
                    "error": "boom" if failed else None,
                    "sampling": json.dumps(request.sampling, sort_keys=True),
                    "model_sha256": stamp.model_sha256,
                    "request_hash": None if failed else stamp.request_hash(request),
                }
            )
    write_parquet(pa.Table.from_pylist(rows, SCHEMA).drop_columns(["extra"]), str(path))
    return path


LINES = [
    {"id": "a", "prompt": "one", "temperature": 0, "max_tokens": 4, "topic": "x"},
    {"id": "b", "prompt": "two", "temperature": 0.7, "max_tokens": 4},  # sampled without a seed: runs
    {"id": "c", "prompt": "three", "temperature": 0.7, "seed": 5, "n": 2, "max_tokens": 4},
    {"id": "d", "prompt": "four", "temperature": 0},  # no max_tokens: reused only if it stopped by itself
    {"id": "e", "prompt": "five", "temperature": 0, "max_tokens": 4},  # failed earlier: runs
]


def test_what_is_reused_and_what_runs(tmp_path, redis_url):
    dataset = write(tmp_path / "d.jsonl", LINES)
    previous = earlier_results(tmp_path / "old.parquet", dataset, error_on={"e"})
    conn = redis.Redis.from_url(redis_url)
    edited = write(tmp_path / "e.jsonl", [{**LINES[0], "topic": "y", "id": "a2"}, *LINES[1:]])
    result = submit(
        conn, edited, output=str(tmp_path / "out"), model=MODEL, reuse=ReuseSource.open(str(previous), STAMP)
    )
    assert (result.valid, result.reused, result.stored) == (5, 2, 3)  # a2 (a under a new id and topic), c
    table, batch = collect(conn, result.batch_id)
    reused = {r["custom_id"]: r for r in table.to_pylist()}
    assert set(reused) == {"a2", "c"}  # the others have no rows yet: they wait for a worker
    assert reused["a2"]["topic"] == "y" and reused["a2"]["output"] == "out a 0" and reused["a2"]["line"] == 1
    assert reused["a2"]["job_id"] == batches.job_id(result.batch_id, "a2")
    assert reused["a2"]["reused_from"] == "batch_" + "0" * 24
    assert [r["output"] for r in table.to_pylist() if r["custom_id"] == "c"] == ["out c 0", "out c 1"]
    assert (batch.completed, batch.total, batch.completion_tokens) == (2, 5, 2 + 4)


def test_a_batch_wholly_reused_completes_with_no_worker(tmp_path, redis_url):
    dataset = write(tmp_path / "d.jsonl", [LINES[0], LINES[2]])
    previous = earlier_results(tmp_path / "old.parquet", dataset, finish="stop")
    conn = redis.Redis.from_url(redis_url)
    result = submit(
        conn, dataset, output=str(tmp_path / "out"), model=MODEL, reuse=ReuseSource.open(str(previous), STAMP)
    )
    assert result.reused == 2 and result.enqueued == 0
    assert batches.get_batch(conn, result.batch_id).status == "completed"


def test_stopped_rows_of_a_request_without_max_tokens_are_reused(tmp_path, redis_url):
    dataset = write(tmp_path / "d.jsonl", [LINES[3]])
    conn = redis.Redis.from_url(redis_url)
    for finish, reused in (("length", 0), ("stop", 1)):
        previous = earlier_results(tmp_path / f"{finish}.parquet", dataset, finish=finish)
        result = submit(
            conn, dataset, output=str(tmp_path / "out"), model=MODEL, reuse=ReuseSource.open(str(previous), STAMP)
        )
        assert result.reused == reused


@pytest.mark.parametrize("change", ["model", "settings", "version"])
def test_another_model_settings_or_output_version_reuses_nothing(tmp_path, redis_url, monkeypatch, change):
    dataset = write(tmp_path / "d.jsonl", [LINES[0], LINES[2]])
    previous = earlier_results(tmp_path / "old.parquet", dataset)
    stamp = STAMP
    if change == "model":
        stamp = dataclasses.replace(STAMP, model_sha256="cd" * 32)
    elif change == "settings":
        stamp = dataclasses.replace(STAMP, settings=STAMP.settings.replace("float16", "float32"))
    else:
        monkeypatch.setattr(fingerprint, "OUTPUT_VERSION", fingerprint.OUTPUT_VERSION + 1)
    result = submit(
        redis.Redis.from_url(redis_url),
        dataset,
        output=str(tmp_path / "out"),
        model=MODEL,
        reuse=ReuseSource.open(str(previous), stamp),
    )
    assert result.reused == 0 and result.stored == 2


def test_a_hash_ending_in_a_zero_byte_is_found(tmp_path):
    """numpy's bytes type drops trailing zero bytes: the index's keys must not lose them."""
    prompt = next(
        f"p{i}"
        for i in range(100_000)
        if STAMP.request_hash(
            parse_dataset(write(tmp_path / "one.jsonl", [{"prompt": f"p{i}", "temperature": 0}])).requests[0]
        ).endswith("00")
    )
    dataset = write(tmp_path / "d.jsonl", [{"prompt": prompt, "temperature": 0}, {"prompt": "x", "temperature": 0}])
    previous = PreviousResults.open(str(earlier_results(tmp_path / "old.parquet", dataset)))
    for request in parse_dataset(dataset).requests:
        assert previous.find(STAMP.request_hash(request)) is not None


@pytest.mark.parametrize("batch_rows", [1, 2, 3, 65_536])
def test_the_index_reads_a_request_whose_rows_span_two_batches(tmp_path, monkeypatch, batch_rows):
    """The index is built a batch of rows at a time: a request's choices cut by a batch boundary are one entry, and
    so are its rows only while they are adjacent, successful and of one hash and custom id."""
    from miro.worker.fleet.intake import reuse

    monkeypatch.setattr(reuse, "INDEX_BATCH_ROWS", batch_rows)
    dataset = write(tmp_path / "d.jsonl", LINES)
    previous = PreviousResults.open(str(earlier_results(tmp_path / "old.parquet", dataset, error_on={"e"})))
    found = {r.custom_id: previous.find(STAMP.request_hash(r)) for r in parse_dataset(dataset).requests}
    # rows: a, b, c (2 choices), d, e (failed): c's two rows are one request; length-cut rows are not "stopped"
    assert found == {"a": (0, 1, False), "b": (1, 1, False), "c": (2, 2, False), "d": (4, 1, False), "e": None}


def test_earlier_rows_that_miro_did_not_write_are_no_traceback(tmp_path):
    """A request_hash that is no sha256 is never found (it was not miro's); a column of another type, or a missing
    one, is one sentence."""
    dataset = write(tmp_path / "d.jsonl", LINES[:2])
    table = pa.Table.from_pylist(
        [
            {"custom_id": "a", "request_hash": "not a hash", "error": None, "finish_reason": None},
            {"custom_id": "b", "request_hash": "zz" * 32, "error": None, "finish_reason": None},
        ]
    )
    pq.write_table(table, tmp_path / "odd.parquet")
    previous = PreviousResults.open(str(tmp_path / "odd.parquet"))  # finish_reason: a column of nulls only
    assert all(previous.find(STAMP.request_hash(r)) is None for r in parse_dataset(dataset).requests)
    pq.write_table(pa.table({"custom_id": ["a"], "request_hash": [5], "error": [None]}), tmp_path / "i.parquet")
    with pytest.raises(MiroError, match="its request_hash column holds int64, not text"):
        PreviousResults.open(str(tmp_path / "i.parquet"))
    pq.write_table(pa.table({"custom_id": ["a"], "request_hash": ["ab" * 32]}), tmp_path / "e.parquet")
    with pytest.raises(MiroError, match="has no error column"):
        PreviousResults.open(str(tmp_path / "e.parquet"))


def test_not_batch_invariant_or_not_miros_results_is_refused(tmp_path):
    with pytest.raises(MiroError, match="--reuse needs batch-invariant outputs"):
        ReuseSource.open(str(tmp_path / "x.parquet"), dataclasses.replace(STAMP, settings="batch_invariant=0"))
    with pytest.raises(MiroError, match="do not exist"):
        ReuseSource.open(str(tmp_path / "x.parquet"), STAMP)
    (tmp_path / "x.parquet").write_text("no parquet")
    with pytest.raises(MiroError, match="cannot be read as Parquet results to reuse"):
        ReuseSource.open(str(tmp_path / "x.parquet"), STAMP)


def test_model_sha256_is_cached_by_path_size_and_mtime(tmp_path, monkeypatch):
    import hashlib
    import os

    monkeypatch.setenv("MIRO_HOME", str(tmp_path / "home"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\1" * 1000)
    assert fingerprint.model_sha256(model) == hashlib.sha256(model.read_bytes()).hexdigest()
    cached = json.loads((tmp_path / "home" / "model_sha256.json").read_text())
    assert cached[str(model)]["sha256"] == fingerprint.model_sha256(model)
    model.write_bytes(b"GGUF" + b"\2" * 1000)
    os.utime(model, ns=(1, 2))  # another mtime: computed again
    assert fingerprint.model_sha256(model) == hashlib.sha256(model.read_bytes()).hexdigest()


def test_miro_submit_reuse(tmp_path, redis_url, tiny_model):
    from click.testing import CliRunner

    from miro.cli.main import cli

    dataset = write(tmp_path / "d.jsonl", [LINES[0], LINES[1]])
    stamp = fingerprint.expected_stamp(tiny_model, {})  # what a worker of the MIRO_* defaults will load
    previous = earlier_results(tmp_path / "old.parquet", dataset, stamp=stamp)
    command = [
        "submit",
        str(dataset),
        "--redis-url",
        redis_url,
        "--output",
        str(tmp_path / "out"),
        "--reuse",
        str(previous),
    ]
    refused = CliRunner().invoke(cli, command)
    assert refused.exit_code == 1
    assert refused.output.strip().splitlines()[-1] == (
        "Error: --reuse needs --model: the rows are reused only for the same model file."
    )
    result = CliRunner().invoke(cli, [*command, "--model", tiny_model])
    assert result.exit_code == 0, result.output
    assert "Reused the earlier rows of 1 of 2 requests." in result.output  # the sampled line without a seed runs


def test_given_no_model_the_lines_must_run_on_the_reuse_sources(tmp_path, redis_url):
    """`miro serve`'s reuse_batch_id: submit is given no --model, the earlier batch's model is ReuseSource.model."""
    dataset = write(tmp_path / "d.jsonl", [LINES[0], LINES[2]])  # they name no model: the default, MODEL
    previous = earlier_results(tmp_path / "old.parquet", dataset)
    conn = redis.Redis.from_url(redis_url)
    output = tmp_path / "out"
    result = submit(conn, dataset, output=str(output), reuse=ReuseSource.open(str(previous), STAMP, model=MODEL))
    assert result.reused == 2 and batches.get_batch(conn, result.batch_id).model == MODEL
    made = conn.zcard(keys.batches())
    with pytest.raises(OtherModel) as err:
        submit(conn, dataset, output=str(output), reuse=ReuseSource.open(str(previous), STAMP, model="other.gguf"))
    assert str(err.value) == (
        f"The results to reuse were made with 'other.gguf', but the lines run on '{MODEL}': a batch reuses only rows "
        "of the model it runs on, so its lines must name that model; nothing was enqueued."
    )
    assert conn.zcard(keys.batches()) == made
    left = [p.relative_to(output) for p in output.rglob("*") if p.is_file() and result.batch_id not in str(p)]
    assert left == []  # the refused batch's reused rows are gone
