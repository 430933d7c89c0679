"""ParquetSink: finished requests become rows in part files, written whole or not at all.

Rows are buffered per batch and written as `{output}/{batch_id}/part-{worker}-{seq}.parquet`
(zstd) every `flush_rows` rows or `flush_seconds` seconds and at shutdown. Each
part is written under a temporary name and renamed, so a reader never sees half
a file; `flush()` returns the rows it made durable, and only then does the
worker mark their jobs finished: a crash can repeat a request, never lose one.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from miro.core.errors import MiroError

_TOP_LOGPROB = pa.struct([("token_id", pa.int32()), ("token", pa.string()), ("bytes", pa.binary()),
                          ("logprob", pa.float64())])
# one entry per generated token, when the request asked for logprobs: the chosen token and its top alternatives
LOGPROBS = pa.list_(pa.struct([("token_id", pa.int32()), ("token", pa.string()), ("bytes", pa.binary()),
                               ("logprob", pa.float64()), ("top_logprobs", pa.list_(_TOP_LOGPROB))]))

SCHEMA = pa.schema([
    ("batch_id", pa.string()),
    ("custom_id", pa.string()),
    ("line", pa.int32()),  # the request's line in the input file: results come back in this order
    ("choice_index", pa.int32()),  # which of the request's n choices
    ("kind", pa.string()),  # "chat" or "completion": the shape of the OpenAI output line
    ("job_id", pa.string()),
    ("model", pa.string()),  # the model that ran the request
    ("requested_model", pa.string()),  # the model the request asked for (an OpenAI body's `model`, or --model)
    ("prompt", pa.string()),
    ("output", pa.string()),
    ("finish_reason", pa.string()),
    ("prompt_tokens", pa.int32()),
    ("cached_tokens", pa.int32()),  # prompt tokens served from the prefix cache
    ("completion_tokens", pa.int32()),
    ("output_token_ids", pa.list_(pa.int32())),
    ("logprobs", LOGPROBS),  # null unless the request asked for logprobs
    ("error", pa.string()),
    ("worker", pa.string()),
    ("started_at", pa.timestamp("ms", tz="UTC")),
    ("finished_at", pa.timestamp("ms", tz="UTC")),
    ("latency_s", pa.float64()),
    ("sampling", pa.string()),
    ("extra", pa.string()),  # a simple line's own fields, JSON; the merged results spread them into columns
])


def open_output(uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and base path for a folder path or a URI (file://, s3://, gs://, ...)."""
    try:
        if "://" in uri:
            return pafs.FileSystem.from_uri(uri)
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as err:
        raise MiroError(f"cannot open the output location '{uri}': {err}.") from None


def write_table_atomically(filesystem: pafs.FileSystem, path: str, table: pa.Table) -> None:
    """Write under a temporary name in the same folder, make it durable, then rename into place."""
    folder, name = path.rsplit("/", 1)
    filesystem.create_dir(folder, recursive=True)
    temporary = f"{folder}/.tmp-{uuid.uuid4().hex}-{name}"
    if isinstance(filesystem, pafs.LocalFileSystem):
        with open(temporary, "wb") as f:
            pq.write_table(table, f, compression="zstd")
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
        directory = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a power cut
        finally:
            os.close(directory)
    else:
        with filesystem.open_output_stream(temporary) as stream:
            pq.write_table(table, stream, compression="zstd")
        filesystem.move(temporary, path)


@dataclass
class ParquetSink:
    output: str
    worker_name: str
    flush_rows: int = 256
    flush_seconds: float = 5.0
    _buffers: dict[str, list[dict]] = field(default_factory=dict)
    _oldest: float | None = None
    _seq: int = 0

    def __post_init__(self):
        self.filesystem, self.base = open_output(self.output)
        self._run = uuid.uuid4().hex[:8]  # part names never collide across restarts of one worker name

    def add(self, row: dict) -> None:
        self._buffers.setdefault(row["batch_id"], []).append(row)
        if self._oldest is None:
            self._oldest = time.monotonic()

    @property
    def pending(self) -> int:
        return sum(len(rows) for rows in self._buffers.values())

    def due(self) -> bool:
        if not self._buffers:
            return False
        return self.pending >= self.flush_rows or time.monotonic() - self._oldest >= self.flush_seconds

    def flush(self) -> list[dict]:
        """Write every buffered row; return them once they are durable."""
        written = []
        for batch_id, rows in list(self._buffers.items()):
            self._seq += 1
            path = f"{self.base}/{batch_id}/part-{self.worker_name}-{self._run}-{self._seq:06d}.parquet"
            table = pa.Table.from_pylist([{name: row.get(name) for name in SCHEMA.names} for row in rows], SCHEMA)
            write_table_atomically(self.filesystem, path, table)
            written.extend(rows)
            del self._buffers[batch_id]
        self._oldest = None
        return written
