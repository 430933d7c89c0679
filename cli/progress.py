"""`miro run`'s progress for its batch on stderr: done / total, tokens/s and time left, fed from Redis.

The speed and the time left are what the run's worker does now (its record's last-10 s token rate, see
worker/fleet/observe/monitor.py), not the batch's counters averaged since the start, which include loading the model and
move only when part files are written. On a terminal a bar is redrawn; piped (a log, nohup, CI) a plain line
is printed whenever the count moves, and at least every PLAIN_EVERY_S. The count is of the requests that
finished (a result or an error): those of a cancelled batch that never ran are said apart, not shown as done.
"""

from __future__ import annotations

import threading
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from miro.worker.fleet.records import batches, workers
from miro.worker.fleet.observe import monitor

from miro.cli.monitor import PLAIN_EVERY_S, duration, rate


class BatchProgress:
    """Context manager: a thread reads the batch and its workers twice a second and redraws (or prints)."""

    def __init__(self, conn, batch_id: str, interval_s: float = 0.5, console: Console | None = None):
        self.conn, self.batch_id, self.interval_s = conn, batch_id, interval_s
        self.console = console or Console(stderr=True)
        self.plain = not self.console.is_terminal
        self._stop = threading.Event()
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[speed]}"),
            console=self.console,
        )
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._printed: tuple[int, float] | None = None  # plain mode: (done, when) of the last line

    def __enter__(self):
        record = batches.get_batch(self.conn, self.batch_id)
        self._task = self._bar.add_task(
            self.batch_id, total=record.total, speed="loading the model", completed=record.finished
        )
        if not self.plain:
            self._bar.start()
        self._thread.start()
        return self

    def print(self, message: str) -> None:
        """A line of text above the bar (a plain line when stderr is not a terminal)."""
        self._bar.console.print(message, markup=False, highlight=False, soft_wrap=True)

    def _update(self, last: bool = False) -> None:
        view = monitor.batch_view(
            batches.get_batch(self.conn, self.batch_id), worker_records=workers.list_workers(self.conn)
        )
        batch = view.batch
        stopped = "expired" if batch.expired else "cancelled"  # an expired batch's cancelled requests expired
        failed = "".join(f", {n:,} {what}" for n, what in ((batch.failed, "failed"), (batch.cancelled, stopped)) if n)
        if view.rate_source == "workers":
            speed = f"{rate(view.tokens_per_s)}{failed}, ETA {duration(view.eta_s)}"
        else:  # the worker has not reported yet (it is loading the model) or the batch is done
            speed = f"{failed.lstrip(', ')}" if batch.remaining == 0 else f"loading the model{failed}"
        self._bar.update(self._task, completed=batch.finished, speed=speed)
        if self.plain:
            now = time.monotonic()
            moved = self._printed is None or batch.done != self._printed[0]
            if last or moved or now - self._printed[1] >= PLAIN_EVERY_S:
                self.print(
                    f"{time.strftime('%H:%M:%S')} {self.batch_id}: {batch.finished:,}/{batch.total:,} done"
                    f"{', ' + speed if speed else ''}"
                )
                self._printed = (batch.done, now)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._update()

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._update(last=True)
        if not self.plain:
            self._bar.stop()
        return False
