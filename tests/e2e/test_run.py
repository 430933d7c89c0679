"""`miro run` interrupted and resumed: real `miro run` processes with their embedded redis-server, a tiny model.

Each run saves finished rows to part files every 0.2 s (--flush-seconds), so a test waits for the first part
file in the state folder and then interrupts: by then some requests are done and most are not.
"""

import json
import re
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import redis
from click.testing import CliRunner
from polling import wait_for

from miro.cli.main import cli
from miro.worker.fleet.records import batches

LINES = 200  # of 100 tokens each, two at a time: a few seconds of work for the tiny model, even on a fast machine
ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}


class Run:
    """One dataset, its output and state folder, and the `miro run` command line for them."""

    def __init__(self, tmp_path: Path, tiny_model: str, *extra: str):
        self.dataset = tmp_path / "d.jsonl"
        self.dataset.write_text(
            "".join(
                json.dumps({"id": f"p{i}", "prompt": f"hello {i}", "max_tokens": 100, "ignore_eos": True}) + "\n"
                for i in range(LINES)
            )
        )
        self.out = tmp_path / "results.parquet"
        self.partial = tmp_path / "results.partial.parquet"
        self.state = tmp_path / "results.parquet.miro-run"
        self.command = [
            sys.executable,
            "-c",
            "from miro.cli.main import cli; cli()",
            "run",
            str(self.dataset),
            "-o",
            str(self.out),
            "--model",
            tiny_model,
            "--kv-cache-memory",
            "8MiB",
            "--max-num-seqs",
            "2",
            "--flush-seconds",
            "0.2",
            *extra,
        ]
        self.processes: list[subprocess.Popen] = []

    def start(self, *extra: str) -> subprocess.Popen:
        """`miro run` in a process group of its own, as a shell runs a foreground job."""
        process = subprocess.Popen(
            self.command + list(extra), stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True
        )
        self.processes.append(process)
        return process

    def run(self, *extra: str) -> subprocess.CompletedProcess:
        finished = subprocess.run(self.command + list(extra), capture_output=True, text=True, env=ENV, timeout=300)
        assert "Traceback" not in finished.stderr and "graceful shutdown failed" not in finished.stderr
        return finished

    def part_files(self) -> list[Path]:
        return sorted(self.state.glob("parts/*/part-*.parquet"))

    def interrupt(self, process: subprocess.Popen, signals=(signal.SIGINT,), whole_group=False) -> str:
        """Send `signals` once some rows are saved; returns the run's stderr once it has ended."""
        assert wait_for(lambda: self.part_files() or process.poll() is not None, timeout_s=120, every_s=0.02)
        assert process.poll() is None, "the run ended before it could be interrupted"
        for signum in signals:
            if whole_group:
                os.killpg(process.pid, signum)  # as a terminal's Ctrl-C reaches every process of the job
            else:
                process.send_signal(signum)
        _, stderr = process.communicate(timeout=120)
        assert "Traceback" not in stderr and "graceful shutdown failed" not in stderr, stderr
        return stderr

    def redis_pid(self) -> int | None:
        pid_file = self.state / "redis" / "redis.pid"
        return int(pid_file.read_text()) if pid_file.exists() else None

    def clean_up(self) -> None:
        """A failed test leaves no process behind: its runs, and a redis-server a killed run left."""
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        pid = self.redis_pid()
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def make_run(tmp_path, tiny_model):
    runs = []

    def make(*extra: str) -> Run:
        runs.append(Run(tmp_path, tiny_model, *extra))
        return runs[-1]

    yield make
    for run in runs:
        run.clean_up()


def partial_rows(run: Run) -> dict[str, dict]:
    """The partial file's rows by custom id, after checking it says it is partial and counts them."""
    table = pq.read_table(run.partial)
    metadata = table.schema.metadata
    assert metadata[b"miro.partial"] == b"true"
    assert int(metadata[b"miro.done"]) == table.num_rows and int(metadata[b"miro.total"]) == LINES
    rows = {row["custom_id"]: row for row in table.to_pylist()}
    assert len(rows) == table.num_rows and all(row["error"] is None for row in rows.values())
    return rows


def assert_resumed(run: Run, before: dict[str, dict], lines: int = LINES) -> list[dict]:
    """--resume finishes the run: one row per line, the rows of the interrupted run kept as they were."""
    resumed = run.run("--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stderr.strip().splitlines()[-1].startswith(f"Wrote {lines} rows to {run.out}")
    rows = pq.read_table(run.out).to_pylist()
    assert sorted(row["custom_id"] for row in rows) == sorted(f"p{i}" for i in range(lines))
    assert all(row["error"] is None and len(row["output_token_ids"]) == 100 for row in rows)
    first_workers = {row["worker"] for row in before.values()}
    for row in rows:  # the requests that finished before the interruption did not run again; the others ran now
        earlier = before.get(row["custom_id"])
        if earlier:
            assert (row["job_id"], row["worker"], row["started_at"]) == (
                earlier["job_id"],
                earlier["worker"],
                earlier["started_at"],
            )
        else:
            assert row["worker"] not in first_workers
    assert not run.partial.exists() and not run.state.exists()
    return rows


def test_ctrl_c_writes_what_finished_as_partial_and_resume_runs_only_the_rest(make_run):
    run = make_run()
    stderr = run.interrupt(run.start())
    lines = stderr.strip().splitlines()
    assert len([line for line in lines if line.startswith("Interrupted: ")]) == 1, stderr
    assert lines[-1].startswith("Interrupted after ") and "run the same command with --resume" in lines[-1], stderr
    assert not run.out.exists()
    before = partial_rows(run)
    assert 0 < len(before) < LINES
    assert f"Interrupted after {len(before)} of {LINES} requests: wrote them to {run.partial}" in lines[-1]
    assert (run.state / "run.json").exists() and run.part_files()

    again = run.run()  # without --resume: the interrupted run is not thrown away
    assert again.returncode == 1
    assert again.stderr == (
        f"Error: {run.state} holds an interrupted run of d.jsonl ({len(before)} of {LINES} "
        "done); add --resume to finish it, or delete that folder to start over.\n"
    )
    other = run.run("--resume", "--max-tokens", "7")  # options that shape the results must be the same
    assert other.returncode == 1 and other.stderr.count("\n") == 1
    assert "was started with no --max-tokens; resume it with the same options" in other.stderr

    assert_resumed(run, before)


@pytest.mark.parametrize("signum, exit_code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_two_signals_stop_at_once_and_still_leave_a_resumable_run(make_run, signum, exit_code):
    run = make_run("--shutdown-grace", "60")
    process = run.start()
    stderr = run.interrupt(process, signals=(signum, signum))
    assert process.returncode == exit_code, stderr
    assert stderr.strip().splitlines()[-1].startswith("Interrupted after "), stderr
    before = partial_rows(run)

    with run.dataset.open("a") as f:  # a line added since: resume says so, and runs it too
        f.write(json.dumps({"id": f"p{LINES}", "prompt": "hello again", "max_tokens": 100, "ignore_eos": True}) + "\n")
    rows = assert_resumed(run, before, LINES + 1)
    assert len(rows) == LINES + 1


def test_ctrl_c_to_the_whole_process_group_leaves_redis_to_the_run(make_run):
    run = make_run()
    process = run.start()
    assert wait_for(run.redis_pid, timeout_s=60)
    stderr = run.interrupt(process, whole_group=True)
    assert process.returncode == 130, stderr
    log = (run.state / "redis" / "redis.log").read_text()
    assert "Received SIGINT" not in log and "User requested shutdown" in log  # the run stopped it, with SHUTDOWN
    assert run.redis_pid() is None  # and it is gone (redis-server removes its pid file on the way out)
    assert_resumed(run, partial_rows(run))


def test_a_run_killed_outright_is_resumed_by_the_next(make_run):
    run = make_run()
    process = run.start()
    assert wait_for(run.part_files, timeout_s=120, every_s=0.02)
    process.kill()
    process.wait()
    leftover = run.redis_pid()
    assert leftover is not None  # its redis-server lives on, in its own session

    rows = assert_resumed(run, {})
    assert len(rows) == LINES
    assert wait_for(lambda: not Path(f"/proc/{leftover}/cwd").exists(), timeout_s=30), "the old Redis still runs"


def test_with_an_external_redis_the_batch_stays_there_and_resume_uses_it(make_run, redis_url):
    run = make_run("--redis-url", redis_url)
    run.interrupt(run.start())
    before = partial_rows(run)
    batch_id = json.loads((run.state / "run.json").read_text())["batch_id"]
    conn = redis.Redis.from_url(redis_url)
    assert batches.get_batch(conn, batch_id).status == "in_progress"
    assert not (run.state / "redis").exists()

    embedded = run.run("--resume", "--redis-url", "")  # the batch is on that Redis, not on an embedded one
    assert embedded.returncode == 1 and "used the Redis at" in embedded.stderr
    assert_resumed(run, before)
    assert batches.get_batch(conn, batch_id).status == "completed"


def test_resume_with_nothing_to_resume_is_one_sentence(tmp_path):
    dataset = tmp_path / "d.jsonl"
    dataset.write_text('{"id": "a", "prompt": "hi"}\n')
    result = CliRunner().invoke(cli, ["run", str(dataset), "-o", str(tmp_path / "r.parquet"), "--resume"])
    assert result.exit_code == 1
    assert result.output == (
        f"Error: There is no interrupted run in {tmp_path / 'r.parquet'}.miro-run to resume; "
        "leave --resume out to start one.\n"
    )
    assert list(tmp_path.iterdir()) == [dataset]


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "does not exist"),
        ('{"id": "a", "prompt": 5}\n', "1 of 1 lines is invalid, so nothing was enqueued"),
    ],
)
def test_a_missing_or_invalid_dataset_fails_before_anything_starts(tmp_path, monkeypatch, content, message):
    from miro.worker.fleet.records.embedded_redis import EmbeddedRedis

    def no_redis(self):
        raise AssertionError("Redis was started")

    monkeypatch.setattr(EmbeddedRedis, "start", no_redis)
    dataset = tmp_path / "d.jsonl"
    if content is not None:
        dataset.write_text(content)
    result = CliRunner().invoke(cli, ["run", str(dataset), "-o", str(tmp_path / "r.parquet")])
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1].startswith("Error: ")
    assert not (tmp_path / "r.parquet.miro-run").exists()


def test_jsonl_output_in_input_order_and_the_runs_pace(tmp_path, tiny_model):
    """--format jsonl writes OpenAI Batch output lines in the file's order (p0 .. p11, not p0, p1, p10, p11, p2)
    and failed requests beside them; the run ends with requests/s and tokens/s. --name, --seed, --top-p are taken."""
    dataset = tmp_path / "d.jsonl"
    lines = [{"id": f"p{i}", "prompt": f"hello {i}", "max_tokens": 3} for i in range(12)]
    lines.insert(5, {"id": "bad", "prompt": 5})  # with --skip-invalid: a failed request, in the errors file
    dataset.write_text("".join(json.dumps(line) + "\n" for line in lines))
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
            "--format",
            "jsonl",
            "--skip-invalid",
            "--name",
            "nightly",
            "--seed",
            "3",
            "--top-p",
            "0.9",
            "--kv-cache-memory",
            "8MiB",
            "--state-dir",
            str(tmp_path / "state"),
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert re.search(r"Ran 12 requests in [\d.]+ s: [\d.]+ requests/s, [\d.,]+ total tokens/s", done.stderr)
    # stderr is not a terminal here: progress comes as plain lines, the last one when all is done
    assert re.search(r"^\d\d:\d\d:\d\d batch_\w+: 13/13 done", done.stderr, re.MULTILINE), done.stderr
    assert [json.loads(x)["custom_id"] for x in out.read_text().splitlines()] == [f"p{i}" for i in range(12)]
    [error] = [json.loads(x) for x in (tmp_path / "r.errors.jsonl").read_text().splitlines()]
    assert error["custom_id"] == "bad" and error["id"] == "batch_req_line-6-invalid"
    assert "Wrote 12 responses to" in done.stderr and "1 errors to" in done.stderr


def test_dry_run_validates_and_starts_nothing(tmp_path, monkeypatch):
    from miro.worker.fleet.records.embedded_redis import EmbeddedRedis

    def no_redis(self):
        raise AssertionError("Redis was started")

    monkeypatch.setattr(EmbeddedRedis, "start", no_redis)
    dataset = tmp_path / "d.jsonl"
    dataset.write_text('{"id": "a", "prompt": "hi"}\n{"id": "b", "prompt": "there"}\n')
    result = CliRunner().invoke(cli, ["run", str(dataset), "-o", str(tmp_path / "r.parquet"), "--dry-run"])
    assert result.exit_code == 0 and "Dry run: 2 valid lines, 0 invalid; nothing was run." in result.output
    assert not (tmp_path / "r.parquet.miro-run").exists() and not (tmp_path / "r.parquet").exists()


def test_a_lines_own_fields_come_back_as_columns(tmp_path, tiny_model):
    dataset = tmp_path / "d.jsonl"
    dataset.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "prompt": "hi", "max_tokens": 2, "category": c}) + "\n"
            for i, c in enumerate(["math", "poetry", "math"])
        )
    )
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
            tiny_model,
            "--kv-cache-memory",
            "8MiB",
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    table = pq.read_table(out)
    assert table["custom_id"].to_pylist() == ["q0", "q1", "q2"]
    assert table["category"].to_pylist() == ["math", "poetry", "math"]
