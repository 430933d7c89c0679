"""What `miro submit` says while it reads a dataset, piped (CliRunner's stderr is no terminal): the first invalid
lines as they are found, the count of the rest, and plain progress lines while it reads."""

import json

import redis
from click.testing import CliRunner

from miro.cli import validation_progress
from miro.cli.common import SHOWN_ERRORS
from miro.cli.main import cli
from miro.worker.fleet.intake import dataset


def test_invalid_lines_come_first_then_the_count_then_one_sentence(tmp_path, redis_url, monkeypatch):
    monkeypatch.setattr(dataset, "PROGRESS_EVERY", 10)
    monkeypatch.setattr(validation_progress, "PLAIN_EVERY_S", 0.0)
    lines = [json.dumps({"id": f"r{i}", "prompt": "hi"}) if i % 2 else '{"id": "broken"' for i in range(100)]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n")
    done = CliRunner().invoke(cli, ["submit", str(path), "--redis-url", redis_url, "--output", str(tmp_path / "out")])
    assert done.exit_code == 1
    said = done.stderr.splitlines()
    errors = [line for line in said if ": not valid JSON" in line]
    assert len(errors) == SHOWN_ERRORS and errors[0].startswith("line 1: ")
    assert "... and 30 more." in said
    progress = [line for line in said if " validating d.jsonl: " in line]
    assert progress and "lines, " in progress[0] and "invalid (" in progress[0]
    assert said[-1].startswith("Error: 50 of 100 lines are invalid, so nothing was enqueued")
    assert redis.Redis.from_url(redis_url).zcard("miro:batches") == 0
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.jsonl"))  # nothing stored


def test_submit_and_run_refuse_a_custom_id_over_the_limit_in_one_sentence(tmp_path):
    """Issue 37: a custom id is at most MAX_CUSTOM_ID characters; `miro submit --dry-run` and `miro run` (which
    validates the file before it starts any Redis or model) refuse a longer one by its line."""
    from miro.worker.fleet.intake.inputs import MAX_CUSTOM_ID

    path = tmp_path / "d.jsonl"
    path.write_text(
        json.dumps({"id": "k" * (MAX_CUSTOM_ID + 1), "prompt": "hi"})
        + "\n"
        + json.dumps({"id": "ok", "prompt": "hi"})
        + "\n"
    )
    sentence = (
        f"line 1: field 'id': a custom id of {MAX_CUSTOM_ID + 1:,} characters is too long (at most {MAX_CUSTOM_ID:,})."
    )
    for command in (["submit", str(path), "--dry-run"], ["run", str(path), "-o", str(tmp_path / "r.parquet")]):
        done = CliRunner().invoke(cli, command)
        assert done.exit_code == 1 and sentence in done.stderr.splitlines(), done.output
        assert "k" * 100 not in done.output
