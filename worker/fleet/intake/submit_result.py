"""SubmitResult: what a submission did (submit.py), or a --resume of one (resubmit.py): the lines read, the
requests stored and enqueued, and the time each part took."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from miro.worker.fleet.intake.inputs import LineError

if TYPE_CHECKING:
    from miro.worker.fleet.intake.read_pass import Read


@dataclass
class SubmitResult:
    batch_id: str | None  # None for a dry run
    queue: str
    priority: str
    lines: int  # request lines read: valid + invalid
    valid: int
    invalid: list[LineError] = field(default_factory=list)
    task: str = "generate"  # what the batch does: "generate" or "embed"
    enqueued: int = 0  # requests queued now (the first window of a new batch; --resume: those queued again)
    stored: int = 0  # requests in the batch's storage, fed to the queue as the fleet drains it
    recorded_invalid: int = 0  # invalid lines newly recorded as failed requests (--skip-invalid)
    already_finished: int = 0  # --resume: requests whose job finished
    in_flight: int = 0  # --resume: requests whose job is queued, started, scheduled or deferred
    expired: int = 0  # --resume: requests whose job had expired from Redis and was enqueued again
    reused: int = 0  # --reuse: requests whose earlier rows are this batch's (not stored, never run)
    unfed: int = 0  # --resume: stored requests a cancel or expiry had left unfed, fed again
    dry_run: bool = False
    resumed: bool = False
    validate_s: float = 0.0
    enqueue_s: float = 0.0

    @classmethod
    def of_read(cls, read: Read, **fields) -> SubmitResult:
        """A result whose lines, valid and invalid ones, task and validation time are those one read pass
        (read_pass.Read) gathered; the rest from `fields`."""
        scan = read.scan
        return cls(
            lines=scan.lines,
            valid=scan.valid,
            invalid=read.errors,
            task=scan.task,
            validate_s=read.validate_s,
            **fields,
        )

    @property
    def jobs_per_s(self) -> float:
        return self.enqueued / self.enqueue_s if self.enqueue_s > 0 else 0.0
