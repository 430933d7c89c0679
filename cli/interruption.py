"""Ctrl-C and SIGTERM during `miro run`: the first lets the requests in flight finish, the second puts them back."""

from __future__ import annotations

import signal

from miro.cli.common import log_to_stderr


class Interruption:
    """SIGINT and SIGTERM while the run is on (`with interruption:`). The first stops the worker taking
    requests and gives those in flight grace_s seconds to finish; the second puts them back on the queue at
    once; later ones change nothing. The handler prints one line and sets flags; the worker's loop acts on them
    between engine steps, so no Redis write or part file is cut in half."""

    def __init__(self, grace_s: float):
        self.grace_s = grace_s
        self.signal: int | None = None  # the first signal, once one came
        self.count = 0
        self.worker = None  # the run's BatchWorker, once it exists
        self.say = log_to_stderr
        self._previous: dict = {}

    def __enter__(self):
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> bool:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        return False

    @property
    def exit_code(self) -> int:
        return 128 + self.signal  # as a shell reports a process a signal ended: 130 for SIGINT, 143 for SIGTERM

    def _handle(self, signum, frame) -> None:
        self.count += 1
        if self.count == 1:
            self.signal = signum
            self.say(self._notice())
            if self.worker is not None:
                self.worker.request_warm_stop(self.grace_s)
        elif self.count == 2 and self.worker is not None:
            if self.worker.in_flight:
                self.say(
                    f"Stopping now: the {_requests(self.worker.requests_in_flight)} in flight go back to the queue."
                )
            self.worker.request_warm_stop(0)

    def _notice(self) -> str:
        if self.worker is None:
            return "Interrupted: stopping before any request starts."
        in_flight = self.worker.requests_in_flight
        if not in_flight:
            return "Interrupted: stopping; no request is in flight."
        return (
            f"Interrupted: finishing the {_requests(in_flight)} in flight for up to {self.grace_s:g} s; "
            "press Ctrl-C again to stop now."
        )


def _requests(n: int) -> str:
    return f"{n:,} request" if n == 1 else f"{n:,} requests"
