"""miro-submit refusing bad input against a real redis-server: invalid lines, an empty or missing file and bad
option values enqueue nothing; --skip-invalid enqueues the valid lines and records the invalid ones as failed."""

import json

import pytest
from submit_helpers import BATCH_ID, GOOD, conn_for, job_of, openai, queue, run, write

from miro.worker.fleet.records import batches

pytestmark = pytest.mark.usefixtures("one_request_per_job")  # they follow one request's RQ job


# ---- bad inputs: nothing enqueued -------------------------------------------------------------------

BAD_CASES = {
    "malformed JSON": ([GOOD, '{"id": "a", "prompt": "x"'], "line 2: not valid JSON"),
    "missing prompt": (
        [GOOD, {"id": "b", "max_tokens": 3}],
        "line 2: the line needs a 'prompt', 'messages' or 'input'",
    ),
    "wrong type": ([GOOD, {"id": "c", "prompt": "x", "max_tokens": "ten"}], "line 2: field 'max_tokens'"),
    "wrong message type": (
        [GOOD, {"id": "d", "messages": [{"role": "user", "content": 5}]}],
        "line 2: field 'messages.0.content'",
    ),
    "unknown url": ([GOOD, openai("e", url="/v1/moderations")], "line 2: field 'url'"),
    "bad method": ([GOOD, openai("f", method="GET")], "line 2: field 'method'"),
    "duplicate custom id": ([GOOD, openai("ok")], "line 2: duplicate custom id 'ok' (first used on line 1)"),
    "invalid UTF-8": ([GOOD, b'{"id": "g", "prompt": "caf\xe9"}'], "line 2: not valid UTF-8"),
    "10 MB line": ([GOOD, json.dumps({"id": "h", "prompt": "x" * 10_000_000})], "line 2: the line is 10,000,"),
}


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_input_enqueues_nothing(tmp_path, redis_url, case):
    lines, message = BAD_CASES[case]
    data = write(tmp_path / "bad.jsonl", *lines)
    result = run("submit", data, "--redis-url", redis_url)
    assert result.exit_code == 1
    assert message in result.stderr
    assert result.stderr.splitlines()[-1].startswith("Error: 1 of 2 lines is invalid, so nothing was enqueued")
    assert result.stdout == "" and "Traceback" not in result.output
    conn = conn_for(redis_url)
    assert conn.dbsize() == 0  # no batch record, no job, no queue
    assert queue(conn).count == 0


def test_empty_file_enqueues_nothing(tmp_path, redis_url):
    data = tmp_path / "empty.jsonl"
    data.write_bytes(b"\n  \n")
    result = run("submit", data, "--redis-url", redis_url)
    assert result.exit_code == 1
    assert result.stderr == f"Error: Dataset file '{data}' is empty: it has no request lines; nothing was enqueued.\n"
    assert conn_for(redis_url).dbsize() == 0


def test_missing_file_is_one_sentence(tmp_path, redis_url):
    result = run("submit", tmp_path / "nope.jsonl", "--redis-url", redis_url)
    assert result.exit_code == 1 and result.stderr.startswith("Error: Dataset file")
    assert "does not exist" in result.stderr
    assert conn_for(redis_url).dbsize() == 0


def test_many_errors_show_the_first_twenty(tmp_path, redis_url):
    data = write(tmp_path / "bad.jsonl", GOOD, *(["{broken"] * 25))
    result = run("submit", data, "--redis-url", redis_url)
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert [line.split(":")[0] for line in lines[:20]] == [f"line {n}" for n in range(2, 22)]
    assert lines[20] == "... and 5 more."
    assert lines[21].startswith("Error: 25 of 26 lines are invalid, so nothing was enqueued")
    assert len(lines) == 22
    assert conn_for(redis_url).dbsize() == 0


def test_bad_option_values_enqueue_nothing(tmp_path, redis_url):
    data = write(tmp_path / "d.jsonl", GOOD)
    bad_top_p = run("submit", data, "--redis-url", redis_url, "--top-p", "0")
    assert bad_top_p.exit_code == 1 and bad_top_p.stderr.startswith("Error: Default sampling options are invalid")
    bad_timeout = run("submit", data, "--redis-url", redis_url, "--job-timeout", "0")
    assert bad_timeout.exit_code == 1 and "job timeout '0' is not valid" in bad_timeout.stderr
    assert conn_for(redis_url).dbsize() == 0


# ---- --skip-invalid ---------------------------------------------------------------------------------


def test_skip_invalid_enqueues_valid_lines_and_records_invalid_ones_as_failed(tmp_path, redis_url):
    data = write(
        tmp_path / "d.jsonl",
        {"id": "a", "prompt": "x"},
        "{broken",
        {"id": "b", "prompt": "y"},
        {"id": "a", "prompt": "again"},
        {"id": "c", "prompt": "z", "top_p": 5},
    )
    result = run("submit", data, "--redis-url", redis_url, "--skip-invalid")
    assert result.exit_code == 0, result.output
    batch_id = result.stdout.strip()
    assert BATCH_ID.fullmatch(batch_id)
    assert "line 2: not valid JSON" in result.stderr and "line 4: duplicate custom id 'a'" in result.stderr
    assert "Recorded 3 invalid lines as failed requests" in result.stderr
    conn = conn_for(redis_url)
    q = queue(conn)
    assert q.job_ids == [batches.job_id(batch_id, "a"), batches.job_id(batch_id, "b")]
    assert job_of(conn, batch_id, "a").kwargs["prompt"] == "x"  # the duplicate did not replace the first
    record = batches.get_batch(conn, batch_id)
    assert record.status == "in_progress" and record.total == 5 and record.failed == 3
    failed = batches.failed_lines(conn, batch_id)
    assert set(failed) == {"line-2", "line-4", "c"}
    assert failed["line-2"]["line"] == 2 and failed["line-2"]["error"].startswith("line 2: not valid JSON")
    assert failed["line-4"] == {
        "custom_id": "line-4",
        "line": 4,
        "error": "line 4: duplicate custom id 'a' (first used on line 1).",
    }
    assert failed["c"]["custom_id"] == "c" and "top_p" in failed["c"]["error"]


def test_skip_invalid_with_no_valid_line_enqueues_nothing(tmp_path, redis_url):
    data = write(tmp_path / "d.jsonl", "{broken", "[1]")
    result = run("submit", data, "--redis-url", redis_url, "--skip-invalid")
    assert result.exit_code == 1 and "None of the 2 lines is valid" in result.stderr
    assert conn_for(redis_url).dbsize() == 0
