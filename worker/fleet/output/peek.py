"""A look into a running batch's results for its page: its first errors (by line, each with its custom id and
message) and a few finished outputs, read from its part files as they appear.

Part files never change once written (sink.py renames them into place whole), so a BatchPeek reads each one
once, and only the columns it shows: a page polled every few seconds during a six-hour batch reads each new
part file once, not the whole batch again. Invalid lines (`--skip-invalid`) are errors too, from Redis.
"""

from __future__ import annotations

import heapq
import threading
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq
import redis

from miro.worker.fleet.records import batches
from miro.worker.fleet.output.rows import SCHEMA
from miro.worker.fleet.output.sink import open_output

_COLUMNS = ["custom_id", "line", "choice_index", "input_index", "output", "finish_reason", "error"]
OUTPUT_CHARS = 500  # of an output shown on the page


@dataclass(frozen=True, order=True)
class PeekedRow:
    """One request's row as the page shows it: an error's message, or an output (cut to OUTPUT_CHARS)."""

    line: int
    custom_id: str
    text: str
    finish_reason: str | None = None


@dataclass
class BatchPeek:
    """The first `max_errors` errors by line and the first `max_outputs` outputs read of one batch."""

    output: str  # the batch's output location
    batch_id: str
    max_errors: int = 10
    max_outputs: int = 5
    errors: list[PeekedRow] = field(default_factory=list)  # the lowest lines, in line order
    outputs: list[PeekedRow] = field(default_factory=list)
    read_parts: set[str] = field(default_factory=set)

    def update(self, conn: redis.Redis) -> BatchPeek:
        """Read the part files written since the last update, and the invalid lines."""
        filesystem, base = open_output(self.output)
        infos = filesystem.get_file_info(pa.fs.FileSelector(f"{base}/{self.batch_id}", allow_not_found=True))
        new = sorted(
            i.path
            for i in infos
            if i.base_name.startswith("part-") and i.base_name.endswith(".parquet") and i.path not in self.read_parts
        )
        for path in new:
            self._take(pq.read_table(path, filesystem=filesystem, columns=_COLUMNS, schema=SCHEMA).to_pylist())
            self.read_parts.add(path)
        invalid = batches.failed_lines(conn, self.batch_id)
        self._take(
            [
                {
                    "custom_id": cid,
                    "line": record.get("line"),
                    "error": record["error"],
                    "output": None,
                    "choice_index": 0,
                    "input_index": None,
                    "finish_reason": None,
                }
                for cid, record in invalid.items()
            ]
        )
        return self

    def _take(self, rows: list[dict]) -> None:
        succeeded = {r["custom_id"] for r in rows if r["error"] is None}
        kept = [e for e in self.errors if e.custom_id not in succeeded]  # a retried request that ran since
        known = {e.custom_id for e in kept}
        for row in rows:
            if row["error"] is not None and row["custom_id"] not in known:
                known.add(row["custom_id"])
                kept.append(PeekedRow(line=row["line"] or 0, custom_id=row["custom_id"], text=row["error"]))
            elif (
                row["error"] is None
                and len(self.outputs) < self.max_outputs
                and row["output"] is not None
                and not row["choice_index"]
                and not row["input_index"]
            ):
                self.outputs.append(
                    PeekedRow(
                        line=row["line"] or 0,
                        custom_id=row["custom_id"],
                        text=row["output"][:OUTPUT_CHARS],
                        finish_reason=row["finish_reason"],
                    )
                )
        self.errors = heapq.nsmallest(self.max_errors, kept)


class PeekCache:
    """The server's BatchPeeks, the most recently asked for `size` batches."""

    def __init__(self, size: int = 32):
        self.size = size
        self.peeks: dict[str, BatchPeek] = {}
        self._lock = threading.Lock()  # the server answers on several threads: a part file is read once

    def peek(self, conn: redis.Redis, batch: batches.BatchRecord) -> BatchPeek:
        with self._lock:
            found = self.peeks.pop(batch.id, None) or BatchPeek(batch.output, batch.id)
            self.peeks[batch.id] = found  # now the most recent
            while len(self.peeks) > self.size:
                self.peeks.pop(next(iter(self.peeks)))
            return found.update(conn)
