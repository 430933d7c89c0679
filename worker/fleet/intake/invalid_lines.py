"""--skip-invalid: each invalid line of the file recorded as a failed request of the batch, under a custom id that
clashes with no valid request (line-N when it has none, or its own is taken)."""

from __future__ import annotations

import redis

from miro.core import defaults
from miro.worker.fleet.records import batches
from miro.worker.fleet.intake.inputs import LineError
from miro.worker.fleet.intake.read_pass import Read
from miro.worker.fleet.intake.resume import known_requests

CHUNK = defaults.SPOOL_CHUNK  # invalid lines looked up and recorded at a time


def invalid_ids(errors: list[LineError], taken: set[str]) -> list[tuple[str, LineError]]:
    """A custom id per invalid line that clashes with no valid request and no other invalid line (`taken`: the
    custom ids of the valid requests that invalid lines name; the others cannot clash)."""
    out = []
    for error in errors:
        cid = error.custom_id
        if not cid or cid in taken:
            cid = f"line-{error.line}"
            if cid in taken:
                cid = f"line-{error.line}-invalid"
        taken.add(cid)
        out.append((cid, error))
    return out


def record_invalid(conn: redis.Redis, batch_id: str, read: Read) -> int:
    """Record each invalid line (--skip-invalid) as a failed request of the batch; returns how many were new."""
    if not read.errors:
        return 0
    recorded = 0
    invalid = invalid_ids(read.errors, read.taken_ids())
    for start in range(0, len(invalid), CHUNK):
        chunk = invalid[start : start + CHUNK]
        known = known_requests(conn, batch_id, [cid for cid, _ in chunk])
        pipe = conn.pipeline(transaction=True)
        for (cid, error), is_request in zip(chunk, known):
            if not is_request:  # --resume of an edited file: leave existing requests alone
                batches.record_failed_line(pipe, batch_id, custom_id=cid, line=error.line, error=error.message)
        recorded += sum(pipe.execute())
    return recorded
