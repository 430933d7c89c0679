"""What `miro submit` and `miro run` say while they read a dataset: its first invalid lines at once, and how far
the reading has got.

On a terminal a bar of the bytes read is drawn once the file takes more than a moment (dataset.PROGRESS_EVERY
lines); piped (a log, CI) a plain line is printed every PLAIN_EVERY_S. The first SHOWN_ERRORS invalid lines are
printed as they are found, and the count of the rest at the end.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

from miro.cli.common import SHOWN_ERRORS

PLAIN_EVERY_S = 10.0


class ValidationProgress:
    """Context manager; pass `on_line_error` and `on_progress` to submit()."""

    def __init__(self, name: str, console: Console | None = None):
        self.name = name
        self.console = console or Console(stderr=True)
        self.plain = not self.console.is_terminal
        self.errors = 0  # invalid lines seen
        self._bar: Progress | None = None
        self._started = time.monotonic()
        self._printed_at = self._started

    def __enter__(self):
        return self

    def _say(self, message: str) -> None:
        (self._bar.console if self._bar else self.console).print(message, markup=False, highlight=False, soft_wrap=True)

    def on_line_error(self, error) -> None:
        self.errors += 1
        if self.errors <= SHOWN_ERRORS:
            self._say(error.message)

    def on_progress(self, scan) -> None:
        status = f"{scan.lines:,} lines, {scan.invalid:,} invalid"
        if self.plain:
            now = time.monotonic()
            if now - self._printed_at >= PLAIN_EVERY_S:
                share = f" ({scan.bytes_read / scan.bytes_total:.0%})" if scan.bytes_total else ""
                self._say(f"{time.strftime('%H:%M:%S')} validating {self.name}: {status}{share}")
                self._printed_at = now
            return
        if self._bar is None:
            self._bar = Progress(
                TextColumn(f"validating {self.name}"),
                BarColumn(),
                DownloadColumn(),
                TextColumn("{task.fields[status]}"),
                console=self.console,
                transient=True,
            )
            self._task = self._bar.add_task("validate", total=scan.bytes_total or None, status=status)
            self._bar.start()
        self._bar.update(self._task, completed=scan.bytes_read, status=status)

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        if self.errors > SHOWN_ERRORS:
            self._say(f"... and {self.errors - SHOWN_ERRORS:,} more.")
        return False
