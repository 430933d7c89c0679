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
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import IO, Iterator

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from miro.core.errors import MiroError

from miro.worker.fleet.output.rows import SCHEMA
from miro.worker.fleet.observe.urls import redacted


def open_output(uri: str | os.PathLike) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and base path for a folder path or a URI (file://, s3://, gs://, ...)."""
    uri = os.fspath(uri)
    try:
        if "://" in uri:
            return pafs.FileSystem.from_uri(uri)
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as err:
        raise MiroError(f"cannot open the output location '{redacted(uri)}': {err}.") from None


@contextmanager
def atomic_output(filesystem: pafs.FileSystem, path: str) -> Iterator[IO[bytes]]:
    """A stream to `path` under a temporary name in the same folder: made durable and renamed into place when the
    block ends, deleted if it raises."""
    folder, name = path.rsplit("/", 1)
    filesystem.create_dir(folder, recursive=True)
    temporary = f"{folder}/.tmp-{uuid.uuid4().hex}-{name}"
    if not isinstance(filesystem, pafs.LocalFileSystem):
        try:
            with filesystem.open_output_stream(temporary) as stream:
                yield stream
        except BaseException:
            with suppress(OSError):
                filesystem.delete_file(temporary)
            raise
        filesystem.move(temporary, path)
        return
    try:
        with open(temporary, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with suppress(FileNotFoundError):
            os.remove(temporary)
        raise
    os.replace(temporary, path)
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself survives a power cut
    finally:
        os.close(directory)


def write_table_atomically(filesystem: pafs.FileSystem, path: str, table: pa.Table) -> None:
    """Write under a temporary name in the same folder, make it durable, then rename into place."""
    with atomic_output(filesystem, path) as stream:
        pq.write_table(table, stream, compression="zstd")


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
        unknown = row.keys() - set(SCHEMA.names)
        if unknown:  # a misspelt key would be written as a null column: a bug, refused where it happens
            raise ValueError(f"rows have no column {', '.join(sorted(unknown))}")
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
