"""`miro run --reuse PREVIOUS.parquet` end to end: a rerun runs only what changed, and a reused row is bitwise the
row a fresh run gives (the default model); what must not be reused is not (another model file, other engine
settings, a sampled request without a seed)."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from miro.cli.main import cli

# the columns that say how and when a row was made, not what it is: a reused row keeps its first run's
RUN_COLUMNS = {"batch_id", "job_id", "worker", "started_at", "finished_at", "latency_s", "cached_tokens", "reused_from"}

LINES = [
    {
        "id": "p0",
        "messages": [{"role": "user", "content": "Name a primary colour."}],
        "temperature": 0,
        "max_tokens": 12,
        "topic": "colours",
    },
    {"id": "p1", "prompt": "The capital of France is", "temperature": 0, "max_tokens": 12, "topic": "places"},
    {"id": "p2", "prompt": "Once upon a time", "temperature": 0.8, "seed": 7, "n": 2, "max_tokens": 12},
    {"id": "p3", "prompt": "One, two, three,", "temperature": 0, "max_tokens": 12, "topic": "numbers"},
    {"id": "p4", "prompt": "A random word:", "temperature": 1.0, "max_tokens": 6},  # sampled, no seed
]


def write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def run(*args) -> str:
    result = CliRunner().invoke(cli, ["run", *map(str, args), "--kv-cache-memory", "32MiB"])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return result.output


def rows(path: Path) -> dict[tuple[str, int], dict]:
    return {(r["custom_id"], r["choice_index"]): r for r in pq.read_table(path).to_pylist()}


def test_a_rerun_reuses_the_unchanged_deterministic_rows_bitwise(tmp_path, smollm2_path):
    first = run(write(tmp_path / "a.jsonl", LINES), "-o", tmp_path / "a.parquet")
    assert "Reused" not in first
    edited = [dict(line) for line in LINES]
    edited[3]["prompt"] = "Four, five, six,"
    edited[1]["topic"] = "capitals"  # its own field: not part of the request
    dataset = write(tmp_path / "b.jsonl", edited)
    output = run(dataset, "-o", tmp_path / "b.parquet", "--reuse", tmp_path / "a.parquet")
    assert "Reused 3 of 5 requests from" in output and "2 to run" in output
    run(dataset, "-o", tmp_path / "fresh.parquet")  # the same file, nothing reused

    a, b, fresh = rows(tmp_path / "a.parquet"), rows(tmp_path / "b.parquet"), rows(tmp_path / "fresh.parquet")
    a_batch = a[("p0", 0)]["batch_id"]
    assert {key: row["reused_from"] for key, row in b.items()} == {
        ("p0", 0): a_batch,
        ("p1", 0): a_batch,
        ("p2", 0): a_batch,
        ("p2", 1): a_batch,
        ("p3", 0): None,
        ("p4", 0): None,
    }  # the edited line and the unseeded sampled one ran
    assert list(pq.read_table(tmp_path / "b.parquet").column("custom_id").to_pylist()) == [
        "p0",
        "p1",
        "p2",
        "p2",
        "p3",
        "p4",
    ]  # in input order
    for key in [k for k in b if k[0] != "p4"]:
        for column in b[key]:
            if column not in RUN_COLUMNS:
                assert b[key][column] == fresh[key][column], (key, column)
    assert b[("p1", 0)]["topic"] == "capitals"  # the new line's own fields, on the reused row
    assert b[("p0", 0)]["started_at"] == a[("p0", 0)]["started_at"]  # when it really ran
    assert b[("p3", 0)]["output"] != a[("p3", 0)]["output"]
    assert all(
        len(row["request_hash"]) == 64 and row["model_sha256"] == a[("p0", 0)]["model_sha256"] for row in b.values()
    )


@pytest.fixture
def tiny_run(tmp_path, tiny_model):
    dataset = write(
        tmp_path / "d.jsonl",
        [{"id": f"q{i}", "prompt": f"hello {i}", "max_tokens": 4, "temperature": 0} for i in range(8)],
    )

    def go(out: str, *extra) -> str:
        result = CliRunner().invoke(
            cli,
            [
                "run",
                str(dataset),
                "-o",
                str(tmp_path / out),
                "--kv-cache-memory",
                "8MiB",
                "--model",
                tiny_model,
                *map(str, extra),
            ],
        )
        assert result.exit_code == 0, result.output
        return result.output

    return go


def test_everything_reused_loads_no_model(tmp_path, tiny_run):
    tiny_run("a.parquet")
    output = tiny_run("b.parquet", "--reuse", tmp_path / "a.parquet")
    assert "Reused 8 of 8 requests" in output and "loading the model" not in output
    assert "Wrote 8 rows" in output


def test_other_settings_or_another_model_file_reuse_nothing(tmp_path, tiny_run, tiny_model):
    tiny_run("a.parquet")
    assert "Reused 0 of 8" in tiny_run("b.parquet", "--reuse", tmp_path / "a.parquet", "--kv-cache-dtype", "float32")
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(Path(tiny_model).read_bytes() + b"\0" * 32)  # padding: another file, by its sha256
    result = CliRunner().invoke(
        cli,
        [
            "run",
            str(tmp_path / "d.jsonl"),
            "-o",
            str(tmp_path / "c.parquet"),
            "--kv-cache-memory",
            "8MiB",
            "--model",
            str(copy),
            "--reuse",
            str(tmp_path / "a.parquet"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "Reused 0 of 8" in result.output


def test_reuse_refusals_are_one_sentence(tmp_path, tiny_run, tiny_model):
    import pyarrow as pa

    pq.write_table(pa.table({"custom_id": ["q0"], "output": ["hi"]}), tmp_path / "old.parquet")
    command = [
        "run",
        str(tmp_path / "d.jsonl"),
        "-o",
        str(tmp_path / "x.parquet"),
        "--model",
        tiny_model,
        "--reuse",
        str(tmp_path / "old.parquet"),
    ]
    result = CliRunner().invoke(cli, command)
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == (
        f"Error: {tmp_path / 'old.parquet'} has no request_hash column: it was written by a miro from before reuse, "
        "or is not miro's results; nothing in it can be reused."
    )
    result = CliRunner().invoke(cli, [*command, "--no-batch-invariant"])
    assert result.exit_code == 1 and "--reuse needs batch-invariant outputs" in result.output
