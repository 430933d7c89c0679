"""The end of `miro run`: its pace, and the merged results or, for a run that did not finish, the partial file."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from miro.cli.common import log_to_stderr
from miro.cli.run_state import RunState
from miro.worker.fleet.records import batches

if TYPE_CHECKING:
    from miro.cli.interruption import Interruption


@dataclass
class Pace:
    """The batch's record when this process's worker started on it (after the model loaded), to report what this
    run did per second, as vLLM's offline runs end. Requests cancelled meanwhile did not run: they do not count."""

    started: float
    at_start: batches.BatchRecord

    @classmethod
    def start(cls, conn, batch_id: str) -> "Pace":
        return cls(time.monotonic(), batches.get_batch(conn, batch_id))

    def summary(self, batch: batches.BatchRecord) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        requests = batch.finished - self.at_start.finished
        prompt = batch.prompt_tokens - self.at_start.prompt_tokens
        completion = batch.completion_tokens - self.at_start.completion_tokens
        if batch.task == "embed":
            return (
                f"Embedded {requests:,} requests in {elapsed:,.1f} s: {requests / elapsed:,.2f} requests/s, "
                f"{prompt / elapsed:,.1f} tokens/s."
            )
        return (
            f"Ran {requests:,} requests in {elapsed:,.1f} s: {requests / elapsed:,.2f} requests/s, "
            f"{(prompt + completion) / elapsed:,.1f} total tokens/s, {completion / elapsed:,.1f} generated tokens/s."
        )


def write_run_results(
    conn, batch_id: str, out_path: str, state: RunState, record: dict, interruption: Interruption, pace: Pace | None
) -> bool:
    """OUTPUT if every request finished (then True), else the partial file; either way the line that says so."""
    from miro.worker.fleet.output import storage
    from miro.worker.fleet.output.results import BatchResults, write_results

    merged = BatchResults(conn, batch_id)  # written a slice of lines at a time
    batch = merged.batch
    partial = partial_path(out_path)
    if pace is not None:
        log_to_stderr(pace.summary(batch))
    if batch.status == "expired":  # what finished, and a batch_expired row for each request the window cut off
        written = write_results(merged, out_path, record["options"].get("format", "parquet"))
        storage.remove(partial)
        log_to_stderr(
            f"Batch {batch_id} expired: its completion window ({batch.completion_window}) ended with "
            f"{batch.expired:,} of {batch.total:,} requests not run. {written.sentence()}, those as "
            "batch_expired errors; run the same command with --resume to run them in a new window."
        )
        return False
    if batch.status == "completed":
        written = write_results(merged, out_path, record["options"].get("format", "parquet"))
        tokens = (
            f"{batch.prompt_tokens:,} tokens embedded"
            if batch.task == "embed"
            else f"{batch.prompt_tokens:,} prompt and {batch.completion_tokens:,} completion tokens"
        )
        log_to_stderr(f"{written.sentence()}: {batch.completed:,} completed, {batch.failed:,} failed, {tokens}.")
        if written.note:
            log_to_stderr(written.note)
        storage.remove(partial)
        return True
    # the partial file holds the finished requests; --resume runs the rest, cancelled ones included
    finished, total = batch.finished, batch.total
    counts = {
        "partial": "true",
        "batch_id": batch_id,
        "total": total,
        "done": finished,
        "completed": batch.completed,
        "failed": batch.failed,
    }
    metadata = {f"miro.{k}".encode(): str(v).encode() for k, v in counts.items()}
    write_results(merged, partial, "parquet", metadata=metadata)
    state.save({**record, "batch_id": batch_id, "done": finished, "total": total})
    stopped = "Interrupted" if interruption.signal else "Stopped"
    log_to_stderr(
        f"{stopped} after {finished:,} of {total:,} requests: wrote them to {partial}; run the same command "
        f"with --resume to finish the other {total - finished:,}."
    )
    return False


def partial_path(out_path: str) -> str:
    """Where an interrupted run writes what finished: results.parquet -> results.partial.parquet."""
    from miro.worker.fleet.output import storage

    return storage.with_suffix(out_path, ".parquet", ".partial.parquet")
