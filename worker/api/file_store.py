"""Files of `miro serve`: bytes in the storage location the fleet shares (a folder or an object-store URL, through
pyarrow filesystems), records in Redis (`miro:file:{id}` hashes, the `miro:files` index).

A file's bytes live at `{storage}/files/{id}`, written under a temporary name and moved into place once whole;
batch part files go under `{storage}/batches/` (submit's output). Nothing here holds a whole file in memory.

A file given an expiry (`expires_after` on upload, a batch's `output_expires_after` for its result files) is
scored by its expires_at in `miro:file-deadlines`. Once past it the file is gone: whoever next reads it through
the store (get, records) deletes its record and its bytes and answers 404, and `miro serve`'s background loop
deletes the rest every second (sweep_expired), so the bytes leave storage even if nobody asks.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Iterator

import redis
from pyarrow import fs as pafs

from miro.core.errors import MiroError
from miro.worker.fleet.records import keys
from miro.worker.fleet.output import storage
from miro.worker.fleet.output.sink import open_output
from miro.worker.fleet.observe.urls import redacted

from miro.worker.api.errors import not_found

READ_CHUNK = 1 << 20


@dataclass
class FileRecord:
    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str = "processed"
    expires_at: int | None = None  # epoch seconds; None: kept until deleted

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


class FileWriter:
    """An open upload: write() chunks, then commit() (the file appears) or abort() (nothing remains)."""

    def __init__(self, filesystem: pafs.FileSystem, path: str):
        self.filesystem, self.path = filesystem, path
        folder, name = path.rsplit("/", 1)
        self.temporary = f"{folder}/.tmp-{uuid.uuid4().hex}-{name}"
        self.stream = filesystem.open_output_stream(self.temporary)
        self.size = 0

    def write(self, data: bytes) -> None:
        self.stream.write(data)
        self.size += len(data)

    def commit(self) -> None:
        self.stream.close()
        self.filesystem.move(self.temporary, self.path)

    def abort(self) -> None:
        self.stream.close()
        try:
            self.filesystem.delete_file(self.temporary)
        except FileNotFoundError:  # never created, or already moved into place
            pass


class FileStore:
    def __init__(self, conn: redis.Redis, storage: str):
        self.conn, self.storage = conn, storage
        self.filesystem, base = open_output(storage)
        self.folder = f"{base.rstrip('/')}/files"
        self.batch_folder = f"{base.rstrip('/')}/batches"  # batch_output, as a path on `filesystem`
        try:
            self.filesystem.create_dir(self.folder, recursive=True)
        except OSError as err:
            raise MiroError(f"Cannot use the storage location '{redacted(storage)}': {err}.") from None

    @property
    def batch_output(self) -> str:
        """Where workers write the part files of batches made here (submit's `output`)."""
        return storage.join(self.storage, "batches")

    def path(self, file_id: str) -> str:
        return f"{self.folder}/{file_id}"

    def new_writer(self) -> tuple[str, FileWriter]:
        file_id = "file-" + secrets.token_hex(12)
        return file_id, FileWriter(self.filesystem, self.path(file_id))

    def add(
        self, file_id: str, size: int, filename: str, purpose: str, expires_after_s: int | None = None
    ) -> FileRecord:
        """Record a file whose bytes are in place; with `expires_after_s` it expires that long after now."""
        created = int(time.time())
        record = FileRecord(
            id=file_id,
            bytes=size,
            created_at=created,
            filename=filename,
            purpose=purpose,
            expires_at=None if expires_after_s is None else created + expires_after_s,
        )
        pipe = self.conn.pipeline(transaction=True)
        pipe.hset(keys.file(file_id), mapping={k: v for k, v in asdict(record).items() if v is not None})
        pipe.zadd(keys.files(), {file_id: time.time()})
        if record.expires_at is not None:
            pipe.zadd(keys.file_deadlines(), {file_id: record.expires_at})
        pipe.execute()
        return record

    def write_lines(
        self, lines: Iterator[bytes], filename: str, purpose: str, expires_after_s: int | None = None
    ) -> FileRecord:
        file_id, writer = self.new_writer()
        try:
            for line in lines:
                writer.write(line)
        except BaseException:
            writer.abort()
            raise
        writer.commit()
        return self.add(file_id, writer.size, filename, purpose, expires_after_s)

    def get(self, file_id: str) -> FileRecord:
        """The file's record; 404 in OpenAI's shape if there is none or it has expired (then it is deleted)."""
        raw = self.conn.hgetall(keys.file(file_id))
        record = _record(raw) if raw else None
        if record is not None and record.expired(time.time()):
            self.remove(file_id)
            record = None
        if record is None:
            raise not_found("file", file_id)
        return record

    def records(self, file_ids: list[str]) -> list[FileRecord]:
        """The records of those ids that still exist and have not expired, in order (the expired ones are deleted)."""
        pipe = self.conn.pipeline(transaction=False)
        for file_id in file_ids:
            pipe.hgetall(keys.file(file_id))
        found, now = [_record(raw) for raw in pipe.execute() if raw], time.time()
        for record in found:
            if record.expired(now):
                self.remove(record.id)
        return [record for record in found if not record.expired(now)]

    def sweep_expired(self, now: float | None = None) -> int:
        """Delete every file past its expires_at, record and bytes; returns how many."""
        now = time.time() if now is None else now
        due = [i.decode() for i in self.conn.zrangebyscore(keys.file_deadlines(), "-inf", now)]
        for file_id in due:
            self.remove(file_id)
        return len(due)

    def ids(self, newest_first: bool) -> list[str]:
        ids = self.conn.zrevrange(keys.files(), 0, -1) if newest_first else self.conn.zrange(keys.files(), 0, -1)
        return [i.decode() for i in ids]

    def delete(self, file_id: str) -> None:
        self.get(file_id)
        self.remove(file_id)

    def remove(self, file_id: str) -> None:
        """The file's record, then its bytes (a record never names bytes that are gone)."""
        pipe = self.conn.pipeline(transaction=True)
        pipe.delete(keys.file(file_id))
        pipe.zrem(keys.files(), file_id)
        pipe.zrem(keys.file_deadlines(), file_id)
        pipe.execute()
        self.delete_bytes(file_id)

    def delete_bytes(self, file_id: str) -> None:
        try:
            self.filesystem.delete_file(self.path(file_id))
        except FileNotFoundError:
            pass

    def chunks(self, file_id: str) -> Iterator[bytes]:
        """The file's bytes, a MiB at a time; opened now, so bytes missing from storage raise here (FileNotFoundError),
        before a response has begun."""
        stream = self.filesystem.open_input_stream(self.path(file_id))

        def read() -> Iterator[bytes]:
            with stream:
                while chunk := stream.read(READ_CHUNK):
                    yield chunk

        return read()

    @contextmanager
    def local_copy(self, file_id: str) -> Iterator[str]:
        """A local path to the file's bytes: the file itself on a local filesystem, else a temporary download."""
        if isinstance(self.filesystem, pafs.LocalFileSystem):
            yield self.path(file_id)
            return
        with tempfile.NamedTemporaryFile(suffix=".jsonl") as copy:
            with self.filesystem.open_input_stream(self.path(file_id)) as stream:
                shutil.copyfileobj(stream, copy, READ_CHUNK)
            copy.flush()
            yield copy.name


def _record(raw: dict[bytes, bytes]) -> FileRecord:
    fields = {k.decode(): v.decode() for k, v in raw.items()}
    expires_at = fields.get("expires_at")
    return FileRecord(
        id=fields["id"],
        bytes=int(fields["bytes"]),
        created_at=int(fields["created_at"]),
        filename=fields["filename"],
        purpose=fields["purpose"],
        status=fields["status"],
        expires_at=int(expires_at) if expires_at else None,
    )
