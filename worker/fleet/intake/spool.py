"""A batch's validated requests in storage, the source of truth while Redis holds only those in flight.

`miro-submit` writes every valid request, in file order, into chunk files of `chunk_size` requests beside the
batch's part files: `{output}/{batch_id}/_requests/{k:07d}.jsonl` (Parquet readers of the batch folder skip a
folder whose name starts with "_"), one JSON object per line with the fields of inputs.Request that are set. The
feeder (feed.py) turns one chunk at a time into RQ jobs; any worker can, since workers already reach `output` to
write their part files. A chunk is written under a temporary name and renamed (an object store's upload is whole
on close), so a reader never sees half of one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from typing import Iterator

from pyarrow import fs as pafs

from miro.core.errors import MiroError

from miro.worker.fleet.records.payload import Request, ResponseEcho
from miro.worker.fleet.output.sink import atomic_output, open_output
from miro.worker.fleet.observe.urls import redacted


def _folder(output: str, batch_id: str) -> tuple[pafs.FileSystem, str]:
    filesystem, base = open_output(output)
    return filesystem, f"{base}/{batch_id}/_requests"


def _chunk_name(index: int) -> str:
    return f"{index:07d}.jsonl"


_NULLABLE = {f.name: None for f in fields(Request)}  # a field left out of a stored line is None


def _encode(request: Request) -> bytes:
    # the fields themselves, not asdict's deep copy of them (a quarter of the time)
    kept = {name: value for name in _NULLABLE if (value := getattr(request, name)) is not None}
    if request.response is not None:
        kept["response"] = asdict(request.response)
    return json.dumps(kept, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _decode(line: bytes) -> Request:
    values = json.loads(line)
    if "model" in values:  # a chunk stored before the field was named requested_model
        values["requested_model"] = values.pop("model")
    values = _NULLABLE | values
    if values["response"] is not None:
        values["response"] = ResponseEcho(**values["response"])
    return Request(**values)


class SpoolWriter:
    """Appends requests; every `chunk_size` of them become one chunk file."""

    def __init__(self, output: str, batch_id: str, chunk_size: int):
        self.filesystem, self.folder = _folder(output, batch_id)
        self.chunk_size = chunk_size
        self.chunks = 0  # chunk files written
        self.requests = 0  # requests in them and in the buffer
        self._buffer: list[bytes] = []

    def add(self, request: Request) -> None:
        self._buffer.append(_encode(request))
        self.requests += 1
        if len(self._buffer) >= self.chunk_size:
            self._write()

    def close(self) -> int:
        """Write what is buffered; returns how many chunk files the batch has."""
        if self._buffer:
            self._write()
        return self.chunks

    def _write(self) -> None:
        with atomic_output(self.filesystem, f"{self.folder}/{_chunk_name(self.chunks)}") as stream:
            stream.write(b"".join(self._buffer))
        self.chunks += 1
        self._buffer = []


def read_chunk(output: str, batch_id: str, index: int) -> list[Request]:
    """The requests of chunk `index`, in file order."""
    filesystem, folder = _folder(output, batch_id)
    with filesystem.open_input_stream(f"{folder}/{_chunk_name(index)}") as stream:
        data = stream.read()
    return [_decode(line) for line in data.splitlines() if line]


def requests_from(output: str, batch_id: str, first: int, chunks: int) -> Iterator[Request]:
    """Every request of chunks first .. chunks - 1, one chunk in memory at a time."""
    for index in range(first, chunks):
        yield from read_chunk(output, batch_id, index)


def check_output(output: str) -> None:
    """MiroError in one sentence if `output` is a file, where the batches' folders must go."""
    filesystem, base = open_output(output)
    if filesystem.get_file_info(base).type == pafs.FileType.File:
        raise MiroError(f"The output location '{redacted(output)}' is a file; give a folder (made if it is not there).")


def remove(output: str, batch_id: str) -> None:
    """Delete the batch's stored requests (a submission that was refused)."""
    filesystem, folder = _folder(output, batch_id)
    if filesystem.get_file_info(folder).type != pafs.FileType.NotFound:
        filesystem.delete_dir(folder)
