"""Structured output end to end: `miro run` on the real default model with OpenAI response_format lines and
vLLM structured_outputs lines; every output that stopped validates, and the results carry its parsed JSON."""

import json
import os
import re
import subprocess
import sys

import jsonschema
import pyarrow.parquet as pq
from click.testing import CliRunner

from miro.cli.main import cli

ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "languages": {"type": "array", "items": {"enum": ["English", "French", "German", "Spanish"]}},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
            "required": ["city", "country"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "languages", "address"],
    "additionalProperties": False,  # as OpenAI's strict mode requires: a small model otherwise adds fields
}
PEOPLE = [
    "Anna Schmidt, 34, lives in Berlin, Germany and speaks German and English.",
    "Pierre Dubois is 58; he lives in Lyon, France, and speaks French.",
    "Maria Lopez (27) from Madrid, Spain speaks Spanish, English and French.",
]
REVIEWS = [
    "The food was wonderful and the staff were kind.",
    "Cold soup, rude waiter, never again.",
    "It was fine, nothing special.",
]
LABELS = ["positive", "negative", "neutral"]
DATE = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"


def chat_line(custom_id, content, **body):
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": content}], "max_tokens": 80, "temperature": 0, **body},
    }


def dataset_lines():
    schema_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    lines = [
        chat_line(f"person-{i}", f"Extract the person as JSON: {text}", response_format=schema_format)
        for i, text in enumerate(PEOPLE)
    ]
    lines += [
        {
            "id": f"review-{i}",
            "messages": [{"role": "user", "content": f"Classify the sentiment: {text}"}],
            "structured_outputs": {"choice": LABELS},
            "temperature": 0.7,
            "seed": i,
        }
        for i, text in enumerate(REVIEWS)
    ]
    lines.append(
        {
            "id": "date",
            "prompt": "The Apollo 11 landing happened on ",
            "max_tokens": 12,
            "structured_outputs": {"regex": DATE},
        }
    )
    lines.append(chat_line("cut", "List some fruits as JSON.", response_format={"type": "json_object"}, max_tokens=3))
    lines.append(chat_line("free", "Say hello.", max_tokens=8))
    return lines


def test_miro_run_enforces_every_constraint_and_reports_parsed_json(tmp_path, smollm2_path):
    dataset = tmp_path / "d.jsonl"
    dataset.write_text("".join(json.dumps(line) + "\n" for line in dataset_lines()))
    out = tmp_path / "r.parquet"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from miro.cli.main import cli; cli()",
            "run",
            str(dataset),
            "-o",
            str(out),
            "--model",
            str(smollm2_path),
            "--kv-cache-memory",
            "64MiB",
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    rows = {r["custom_id"]: r for r in pq.read_table(out).to_pylist()}
    for i in range(len(PEOPLE)):
        row = rows[f"person-{i}"]
        assert row["finish_reason"] == "stop", row
        jsonschema.validate(json.loads(row["output"]), PERSON)
        assert json.loads(row["parsed"]) == json.loads(row["output"])
    assert {rows[f"review-{i}"]["output"] for i in range(len(REVIEWS))} <= set(LABELS)
    assert all(rows[f"review-{i}"]["parsed"] is None for i in range(len(REVIEWS)))  # not JSON: nothing to parse
    assert re.fullmatch(DATE, rows["date"]["output"]) and rows["date"]["finish_reason"] == "stop"
    assert rows["cut"]["finish_reason"] == "length" and rows["cut"]["parsed"] is None
    assert rows["free"]["parsed"] is None
    assert 'Note: 1 structured outputs stopped at max_tokens (finish_reason "length") and may not parse' in done.stderr


def test_a_default_constraint_for_every_line_and_the_openai_output(tmp_path, tiny_model):
    """`miro run --choice` constrains the lines without a constraint of their own; the OpenAI JSONL carries the
    constrained text as the message content."""
    dataset = tmp_path / "d.jsonl"
    dataset.write_text(
        "".join(
            json.dumps(line) + "\n"
            for line in [
                {"id": "a", "prompt": "one", "max_tokens": 10},
                {"id": "b", "prompt": "two", "max_tokens": 10, "structured_outputs": {"regex": "[0-9]{3}"}},
                chat_line("c", "three", max_tokens=10),
            ]
        )
    )
    out = tmp_path / "r.jsonl"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from miro.cli.main import cli; cli()",
            "run",
            str(dataset),
            "-o",
            str(out),
            "--model",
            tiny_model,
            "--kv-cache-memory",
            "8MiB",
            "--format",
            "jsonl",
            "--choice",
            "yes",
            "--choice",
            "no",
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    bodies = {x["custom_id"]: x["response"]["body"] for x in map(json.loads, out.read_text().splitlines())}
    assert bodies["a"]["choices"][0]["text"] in ("yes", "no")
    assert re.fullmatch("[0-9]{3}", bodies["b"]["choices"][0]["text"])
    assert bodies["c"]["choices"][0]["message"]["content"] in ("yes", "no")


def test_generate_takes_a_json_schema_file_a_regex_or_choices(tmp_path, tiny_model):
    schema = tmp_path / "s.json"
    schema.write_text(
        json.dumps(
            {
                "type": "object",
                "properties": {"ok": {"type": "boolean"}},
                "required": ["ok"],
                "additionalProperties": False,
            }
        )
    )
    options = ["--model", tiny_model, "--max-tokens", "20"]
    result = CliRunner().invoke(cli, ["generate", "hi", "--json-schema", str(schema), *options])
    assert result.exit_code == 0 and json.loads(result.output) in ({"ok": True}, {"ok": False}), result.output
    result = CliRunner().invoke(cli, ["generate", "hi", "--regex", "[a-c]{4}", *options])
    assert result.exit_code == 0 and re.fullmatch("[a-c]{4}\n", result.output)
    result = CliRunner().invoke(cli, ["generate", "hi", "--choice", "red", "--choice", "blue", *options])
    assert result.exit_code == 0 and result.output in ("red\n", "blue\n")


def test_generate_refuses_a_bad_constraint_in_one_sentence(tmp_path, tiny_model):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for args, message in [
        (["--json-schema", str(bad)], f"Error: --json-schema {bad}: not valid JSON"),
        (["--json-schema", str(tmp_path / "missing.json")], "cannot read the file (No such file or directory)."),
        (["--regex", "(ab"], "Error: structured_outputs.regex does not compile: "),
        (["--regex", "a", "--choice", "a"], "Error: give one of --json-schema, --regex, --choice and --grammar"),
    ]:
        result = CliRunner().invoke(cli, ["generate", "hi", "--model", tiny_model, *args])
        assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output, result.output
