"""`miro status` and `miro watch` on a real redis-server and real BatchWorkers on a tiny GGUF model; the figures
they derive (worker/fleet/observe/monitor.py) on records made in the test."""

import dataclasses
import io
import json
import os
import re
import sys
import threading
import time

import pytest
import redis
from click.testing import CliRunner
from polling import wait_for
from rich.console import Console
from rq import Queue
from rq.serializers import JSONSerializer

from miro.cli.main import cli
from miro.cli.monitor import render_status, render_watch, watch
from miro.core.kernels import cpu
from miro.core.engine.stats import EngineStats
from miro.worker import BatchWorker
from miro.worker.fleet.records import batches, workers
from miro.worker.fleet.observe import monitor
from miro.worker.fleet.records.workers import WorkerRecord

pytestmark = pytest.mark.usefixtures("one_request_per_job")  # they follow one request's RQ job

TOTAL = 40
HOLD_AFTER = 10


class HoldingWorker(BatchWorker):
    """A BatchWorker that, once it has finished `hold_after` jobs and holds others in flight, stops between engine
    steps (still refreshing its Redis hash) until `release` is set: a batch caught in the middle, however fast
    the machine is. The tiny model runs 40 requests in well under a second, too fast to catch otherwise."""

    def __init__(self, *args, hold_after: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.hold_after, self.release = hold_after, threading.Event()

    def _tick(self):
        super()._tick()
        while self.jobs_done >= self.hold_after and self.in_flight and not self.release.wait(0.05):
            super()._tick()


@pytest.fixture
def held_batch(tmp_path, redis_url, tiny_model):
    """A batch of 40 requests (60 tokens each) with a worker holding it in the middle; yields
    (batch id, worker, the worker's Redis hash as it was published while holding)."""
    dataset = tmp_path / "d.jsonl"
    dataset.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "prompt": f"hello {i}", "max_tokens": 60, "ignore_eos": True}) + "\n"
            for i in range(TOTAL)
        )
    )
    submitted = CliRunner().invoke(
        cli,
        ["submit", str(dataset), "--redis-url", redis_url, "--model", tiny_model, "--output", str(tmp_path / "out")],
    )
    assert submitted.exit_code == 0, submitted.output
    batch_id = submitted.stdout.strip()
    conn = redis.Redis.from_url(redis_url)
    queue = Queue(batches.get_batch(conn, batch_id).queue, connection=conn, serializer=JSONSerializer)
    worker = HoldingWorker(
        [queue],
        connection=conn,
        serializer=JSONSerializer,
        model=tiny_model,
        flush_rows=1,
        engine_options={"kv_cache_memory": "4MiB", "max_num_seqs": 4},
        hold_after=HOLD_AFTER,
    )
    thread = threading.Thread(target=worker.work, kwargs={"burst": True, "logging_level": "WARNING"}, daemon=True)
    thread.start()
    try:
        # the hash the worker publishes once it holds: jobs done, requests in flight, and it stays put
        held = wait_for(
            lambda: next((w for w in workers.list_workers(conn) if w.jobs_done >= HOLD_AFTER and w.in_flight > 0), None)
        )
        assert held, "the worker never held the batch in the middle"
        yield batch_id, worker, held
    finally:
        worker.release.set()
        thread.join(timeout=120)
    assert not thread.is_alive()


def test_status_json_and_tables_while_a_batch_is_in_progress(held_batch, redis_url):
    batch_id, worker, held = held_batch
    conn = redis.Redis.from_url(redis_url)

    result = CliRunner().invoke(cli, ["status", batch_id, "--json", "--redis-url", redis_url])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    record = batches.get_batch(conn, batch_id)
    batch = shown["batch"]
    for counter in ("total", "completed", "failed", "cancelled", "prompt_tokens", "completion_tokens"):
        assert batch[counter] == getattr(record, counter), counter
    assert batch["status"] == "in_progress" and batch["total"] == TOTAL
    assert batch["done"] == record.completed + record.failed + record.cancelled
    assert 0 < batch["done"] < TOTAL and batch["remaining"] == TOTAL - batch["done"]
    assert batch["completed"] == held.jobs_done  # one worker: its jobs are the batch's
    assert batch["tokens"] == record.prompt_tokens + record.completion_tokens > 0
    assert batch["completion_tokens"] == 60 * batch["completed"]
    assert batch["elapsed_s"] > 0 and batch["tokens_per_s"] > 0 and batch["eta_s"] > 0

    [row] = shown["workers"]
    assert row["name"] == worker.name and row["state"] == "busy" and batch_id in row["batches"]
    queue = batch["queue"]  # a worker listens to each of its queues at every priority, most urgent first
    assert row["queues"] == [f"{queue}/high", queue, f"{queue}/low"] and row["in_flight"] > 0
    assert row["queued"] == TOTAL - batch["done"] - row["in_flight"]
    assert 0 < row["kv_blocks_used"] <= row["kv_blocks_total"]
    assert row["kv_usage"] == pytest.approx(row["kv_blocks_used"] / row["kv_blocks_total"])
    assert row["running"] + row["waiting"] == row["in_flight"]
    assert row["architecture"] == "llama" and row["weight_format"] in ("f32", "native")
    assert isinstance(row["weight_memory"], int) and row["weight_memory"] > 0  # the default model fits: f32
    assert row["cpu_tier"] == cpu.TIER.name and row["cpu_tier"] in cpu.TIERS  # the tier its kernels run
    assert workers.get_worker(conn, worker.name).cpu_tier == cpu.TIER.name  # the hash itself holds it
    from miro.worker.api.fleet_routes import _workers  # what `miro serve`'s /v1/workers and /v1/fleet list

    assert [w.cpu_tier for w in _workers(workers.list_workers(conn))] == [cpu.TIER.name]

    human = CliRunner().invoke(cli, ["status", batch_id, "--redis-url", redis_url])
    assert human.exit_code == 0, human.output
    assert batch_id in human.output and "in_progress" in human.output and worker.name in human.output
    assert f"{batch['done']}/{TOTAL} done" in human.output
    assert re.search(
        rf"cpu tier *\n{re.escape(worker.name)} .* llama \w+ [\d.]+ \w*B +{re.escape(cpu.TIER.name)} *\n", human.output
    ), human.output

    listed = CliRunner().invoke(cli, ["status", "--redis-url", redis_url])
    assert listed.exit_code == 0, listed.output
    assert batch_id in listed.output and "in_progress" in listed.output and worker.name in listed.output
    listed_json = json.loads(CliRunner().invoke(cli, ["status", "--json", "--redis-url", redis_url]).stdout)
    assert [b["id"] for b in listed_json["batches"]] == [batch_id]
    assert [w["name"] for w in listed_json["workers"]] == [worker.name]
    assert listed_json["workers"][0]["cpu_tier"] == cpu.TIER.name
    assert re.search(rf"\n{re.escape(worker.name)} .* {re.escape(cpu.TIER.name)} *\n", listed.output), listed.output


def recorded_text(console) -> str:
    return console.export_text(clear=False)


def watch_releasing_once_shown(conn, batch_id, worker, console, shown, text: str) -> str:
    """`miro watch` on the held batch; the held requests are let go once `text` is in what it `shown`."""

    def release_once_shown():
        try:
            wait_for(lambda: text in shown(), timeout_s=30)
        finally:
            worker.release.set()

    releaser = threading.Thread(target=release_once_shown, daemon=True)
    releaser.start()
    line = watch(conn, batch_id, interval=0.1, console=console)
    releaser.join()
    return line


def test_watch_follows_the_batch_and_ends_when_it_completes(held_batch, redis_url):
    batch_id, worker, held = held_batch
    conn = redis.Redis.from_url(redis_url)
    done_while_held = batches.get_batch(conn, batch_id).completed
    # a terminal console, so every frame is recorded, not only the last
    console = Console(record=True, width=120, force_terminal=True, file=io.StringIO())
    line = watch_releasing_once_shown(
        conn, batch_id, worker, console, lambda: recorded_text(console), f"{done_while_held}/{TOTAL}"
    )
    text = recorded_text(console)
    assert f"{done_while_held}/{TOTAL}" in text and "in_progress" in text and worker.name in text
    assert line.startswith(f"{batch_id} completed: {TOTAL}/{TOTAL} done ({TOTAL} completed, 0 failed)")
    assert text.rstrip().endswith(line)
    assert batches.get_batch(conn, batch_id).status == "completed"


def test_watch_piped_prints_a_plain_line_as_the_batch_moves(held_batch, redis_url):
    """Not a terminal (tee, nohup, a CI log): one timestamped line per change, each on its own line, while it
    runs; then the summary on a line of its own."""
    batch_id, worker, held = held_batch
    conn = redis.Redis.from_url(redis_url)
    done_while_held = batches.get_batch(conn, batch_id).completed
    out = io.StringIO()
    console = Console(file=out, width=80)  # a file: not a terminal
    assert not console.is_terminal
    line = watch_releasing_once_shown(conn, batch_id, worker, console, out.getvalue, f"{done_while_held}/{TOTAL} done")
    printed = out.getvalue().splitlines()
    progress_lines = printed[:-1]
    assert printed[-1] == line and "\x1b" not in out.getvalue()
    assert re.match(rf"\d\d:\d\d:\d\d {batch_id} in_progress: {done_while_held}/{TOTAL} done", progress_lines[0])
    assert any(f"{batch_id} completed: {TOTAL}/{TOTAL} done" in p for p in progress_lines)
    assert all("worker" in p for p in progress_lines) and len(progress_lines) >= 2


def read_until_exit(master: int, proc, timeout_s: float = 120.0, until: str | None = None) -> str:
    """What the process wrote on the pty, read until it exits (or, with `until`, until that text appears)."""
    import select

    chunks = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the process closed the pty
                data = b""
            if not data:
                break
            chunks.append(data.decode(errors="replace"))
            if until is not None and until in plain("".join(chunks)):
                break
        elif proc.poll() is not None and until is None:
            break
    return "".join(chunks)


def plain(terminal_output: str) -> str:
    """Terminal output without its escape sequences."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r", "", terminal_output)


def test_watch_as_a_process_on_a_terminal(held_batch, redis_url):
    import pty
    import subprocess

    batch_id, worker, held = held_batch
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "LINES": "40", "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    miro = os.path.join(os.path.dirname(sys.executable), "miro")  # the console script of this environment
    proc = subprocess.Popen(
        [miro, "watch", batch_id, "--interval", "0.2", "--redis-url", redis_url],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
    )
    os.close(slave)
    try:
        before = read_until_exit(master, proc, timeout_s=60, until=batch_id)  # drawn while the worker holds
        worker.release.set()
        output = plain(before + read_until_exit(master, proc))
        assert proc.wait(timeout=60) == 0, output
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert batch_id in output and "in_progress" in output
    assert f"{batch_id} completed: {TOTAL}/{TOTAL} done" in output


def test_unknown_batch_is_one_sentence(redis_url):
    for command in (["status", "batch_nope"], ["status", "batch_nope", "--json"], ["watch", "batch_nope"]):
        result = CliRunner().invoke(cli, command + ["--redis-url", redis_url])
        assert result.exit_code == 1
        assert result.output == "Error: There is no batch 'batch_nope' on this Redis.\n"


def test_redis_unreachable_is_one_sentence():
    for command in (["status"], ["status", "batch_x", "--json"], ["watch"]):
        result = CliRunner().invoke(cli, command + ["--redis-url", "redis://127.0.0.1:1/0"])
        assert result.exit_code == 1
        assert result.output.startswith("Error: Cannot reach Redis at redis://127.0.0.1:1/0")
        assert result.output.count("\n") == 1


def test_watch_without_a_batch_ends_at_once_when_none_is_active(redis_url):
    conn = redis.Redis.from_url(redis_url)
    finished = batches.create_batch(conn, name="n", model="m", input_file="f", output="o", total=1, queue="miro")
    batches.set_status(conn, finished, "in_progress")
    batches.count_finished(conn, finished, "a", prompt_tokens=3, completion_tokens=2)
    console = Console(record=True, width=120)
    assert watch(conn, None, interval=0.1, console=console) == "No batch is active."
    listed = CliRunner().invoke(cli, ["status", "--redis-url", redis_url])
    assert finished in listed.output and "completed" in listed.output


# -- the figures, on records made here -----------------------------------------------------------


def record(validating_at=1000.0, in_progress_at=1010.0, completed_at=None, **fields) -> batches.BatchRecord:
    base = {
        "id": "batch_a",
        "name": "d.jsonl",
        "status": "in_progress",
        "model": "m",
        "queue": "miro",
        "output": "/out",
        "input_file": "/d.jsonl",
        "created_at": 1000.0,
        "total": 100,
        "completed": 30,
        "failed": 5,
        "cancelled": 5,
        "prompt_tokens": 400,
        "completion_tokens": 1600,
    }
    stamps = {
        status: at
        for status, at in (("validating", validating_at), ("in_progress", in_progress_at), ("completed", completed_at))
        if at is not None
    }
    return batches.BatchRecord(**{**base, **fields}, stamps=stamps)


def worker_record(name: str, tokens_per_s: float = 0.0, **fields) -> WorkerRecord:
    return WorkerRecord(name=name, stats=EngineStats(generation_tokens_per_s=tokens_per_s), **fields)


def test_batch_view_derives_done_rates_and_eta():
    view = monitor.batch_view(record(), now=1030.0)
    assert (view.batch.done, view.batch.remaining, view.batch.tokens) == (40, 60, 2000)
    assert (view.age_s, view.elapsed_s) == (30.0, 20.0)
    assert (view.requests_per_s, view.tokens_per_s, view.eta_s) == (2.0, 100.0, 30.0)

    finished = monitor.batch_view(record(status="completed", completed=90, completed_at=1060.0), now=2000.0)
    assert (finished.elapsed_s, finished.batch.remaining, finished.eta_s) == (50.0, 0, None)
    # resumed after completing: the old completed_at is ignored, the run counts from the new in_progress_at
    resumed = monitor.batch_view(record(completed_at=1005.0), now=1030.0)
    assert resumed.elapsed_s == 20.0
    waiting = monitor.batch_view(
        record(status="validating", in_progress_at=None, completed=0, failed=0, cancelled=0), now=1030.0
    )
    assert (waiting.elapsed_s, waiting.tokens_per_s, waiting.eta_s) == (None, None, None)


def test_rate_window_follows_the_recent_speed_and_falls_back_to_the_average():
    window = monitor.RateWindow(window_s=30.0, min_span_s=5.0)
    # since start: 40 requests in 20 s; the window has one sample, so the average is used
    assert monitor.batch_view(record(), now=1030.0, window=window).requests_per_s == 2.0
    for t in range(1, 41):  # then 1 request and 10 tokens a second
        view = monitor.batch_view(
            record(completed=30 + t, completion_tokens=1600 + 10 * t), now=1030.0 + t, window=window
        )
    assert window.samples[-1][0] - window.samples[0][0] == 30.0  # older samples left the window
    assert (view.requests_per_s, view.tokens_per_s) == (1.0, 10.0)
    assert view.eta_s == view.batch.remaining / 1.0
    window.add(2000.0, 3, 10)  # counters went back (a retry): start over
    assert window.rates() is None and len(window.samples) == 1


def test_early_in_a_batch_rates_and_eta_come_from_what_the_workers_do_now():
    """1% into a batch (1 request counted, 20 tokens, 60 s in, most of it loading), two workers at 160 and
    180 tok/s (the second also on another batch): 250 tok/s now, so 99 requests x 20 tokens take 7.9 s, not the
    counters' 99 minutes."""
    early = record(
        total=100, completed=1, failed=0, cancelled=0, prompt_tokens=8, completion_tokens=12, in_progress_at=1000.0
    )
    fleet = [
        worker_record("w1", 160.0, batches=["batch_a"]),
        worker_record("w2", 180.0, batches=["batch_a", "batch_b"]),
        worker_record("w3", 500.0, batches=["batch_b"]),  # not on this batch
        worker_record("w4", batches=["batch_a"]),
    ]  # not reporting yet
    counted = monitor.batch_view(early, now=1060.0)
    assert counted.rate_source == "counters" and counted.eta_s == 99 * 60.0
    live = monitor.batch_view(early, now=1060.0, worker_records=fleet)
    assert live.rate_source == "workers" and live.tokens_per_s == 250.0
    assert live.eta_s == pytest.approx(99 * 20 / 250.0)
    nothing_counted = monitor.batch_view(
        record(completed=0, failed=0, cancelled=0, prompt_tokens=0, completion_tokens=0),
        now=1060.0,
        worker_records=fleet,
    )
    assert nothing_counted.tokens_per_s == 250.0 and nothing_counted.eta_s is None
    finished = monitor.batch_view(
        record(status="completed", completed=90, completed_at=1060.0), now=1070.0, worker_records=fleet
    )
    assert finished.rate_source == "counters" and finished.eta_s is None


def test_relevant_workers_are_those_on_the_batch_or_its_queue():
    fleet = [
        worker_record("w1", queues=["miro"]),
        worker_record("w2", queues=["other"], batches=["batch_a"]),
        worker_record("w3", queues=["other"], batches=["batch_b"]),
    ]
    assert [w.name for w in monitor.relevant_workers(fleet, record())] == ["w1", "w2"]


def test_render_on_a_recording_console():
    worker = WorkerRecord(
        name="w1",
        host="h",
        state="busy",
        queues=["miro"],
        batches=["batch_a"],
        stats=EngineStats(
            kv_blocks_used=12, kv_blocks_total=48, kv_usage=0.25, running=3, waiting=1, generation_tokens_per_s=1234.4
        ),
        jobs_done=30,
        jobs_failed=5,
        architecture="llama",
        weight_format="native",
        weight_memory=3 * 2**20,
        cpu_tier="avx2",
    )
    view = monitor.batch_view(record(), now=1030.0)
    console = Console(record=True, width=120)
    console.print(render_watch(monitor.Snapshot([view], [worker])))
    console.print(render_status(monitor.BatchSnapshot(view, [worker]), now=1030.0))
    console.print(render_status(monitor.Snapshot([view], [worker]), now=1030.0))
    text = console.export_text()
    assert "batch_a  in_progress  40/100 done, 5 failed, 5 cancelled" in text and "40%  100 tok/s  ETA 30s" in text
    assert "w1  busy  3 running  1 waiting  1,234 tok/s" in text and "KV 12/48 (25%)" in text
    assert "40/100 done: 30 completed, 5 failed, 5 cancelled, 60 remaining" in text
    assert "100 tok/s, 2.0 requests/s over 20s" in text
    assert re.search(r"batch_a +d.jsonl +in_progress +40/100 +5 +5 +2,000 +30s", text)
    assert re.search(r"w1 +h +busy +12/48 \(25%\) +3/1 +1,234 +30/5 +llama native 3.0 MiB +avx2", text)
    older = dataclasses.replace(worker, cpu_tier=None)  # a worker from before the field
    console = Console(record=True, width=120)
    console.print(render_status(monitor.Snapshot([], [older]), now=1030.0))
    assert re.search(r"w1 +h +busy .* +llama native 3.0 MiB +- *\n", console.export_text())
