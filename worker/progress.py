"""A progress bar for one batch on stderr (done / total, tokens/s, time left), fed from its Redis record."""

from __future__ import annotations

import threading
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from . import batches


class BatchProgress:
    """Context manager: a thread reads the batch counters twice a second and redraws the bar."""

    def __init__(self, conn, batch_id: str, interval_s: float = 0.5):
        self.conn, self.batch_id, self.interval_s = conn, batch_id, interval_s
        self._stop = threading.Event()
        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("{task.fields[speed]}"), TimeRemainingColumn(), console=Console(stderr=True))
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._started = time.monotonic()
        record = batches.get_batch(self.conn, self.batch_id)
        self._tokens_before = record["prompt_tokens"] + record["completion_tokens"]  # a resumed batch's earlier runs
        self._task = self._bar.add_task(self.batch_id, total=record["total"], speed="",
                                        completed=record["completed"] + record["failed"])
        self._bar.start()
        self._thread.start()
        return self

    def print(self, message: str) -> None:
        """A line of text above the bar (a plain line when stderr is not a terminal)."""
        self._bar.console.print(message, markup=False, highlight=False, soft_wrap=True)

    def _update(self) -> None:
        record = batches.get_batch(self.conn, self.batch_id)
        elapsed = max(time.monotonic() - self._started, 1e-9)
        tokens = record["prompt_tokens"] + record["completion_tokens"] - self._tokens_before
        failed = f", {record['failed']} failed" if record["failed"] else ""
        self._bar.update(self._task, completed=record["completed"] + record["failed"],
                         speed=f"{tokens / elapsed:.0f} tok/s{failed}")

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._update()

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._update()
        self._bar.stop()
        return False
