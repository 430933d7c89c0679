"""Result files at a location: a local path, or a URI that a pyarrow filesystem opens (s3://bucket/key, with
?endpoint_override=host:port&scheme=http for an S3-compatible server of your own; gs://, hdfs://, file://).

`miro results` and `miro run` write their merged results through these, so an object store takes them as a
local folder does; the part files go through the same filesystems (sink.open_output).
"""

from __future__ import annotations

import io
import os
import re
from typing import TextIO

from pyarrow import fs as pafs

from miro.worker.fleet.output.sink import open_output

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_uri(location: str | os.PathLike) -> bool:
    return bool(_SCHEME.match(os.fspath(location)))


def _split(location: str) -> tuple[str, str]:
    """A URI's path and its ?query (kept apart so suffixes go on the path); a local path and ''."""
    if not is_uri(location):
        return location, ""
    path, mark, query = location.partition("?")
    return path, mark + query


def join(location: str, name: str) -> str:
    """`name` inside a location: a folder path (made absolute) or a URI, whose ?query stays at the end."""
    if not is_uri(location):
        return os.path.join(os.path.abspath(location), name)
    path, query = _split(location)
    return f"{path.rstrip('/')}/{name}{query}"


def with_suffix(location: str, old: str, new: str) -> str:
    """`old` at the end of the location's path replaced by `new` (added if absent): results.parquet ->
    results.partial.parquet, s3://b/out.jsonl?scheme=http -> s3://b/out.errors.jsonl?scheme=http."""
    path, query = _split(location)
    return path.removesuffix(old) + new + query


def name(location: str) -> str:
    """The last part of the location's path: s3://bucket/runs/results.parquet?... -> results.parquet."""
    return _split(location)[0].rstrip("/").rsplit("/", 1)[-1]


def remove(location: str) -> None:
    """Delete the file at the location if there is one."""
    filesystem, path = open_output(location)
    if filesystem.get_file_info(path).type != pafs.FileType.NotFound:
        filesystem.delete_file(path)


def open_text(location: str | os.PathLike) -> TextIO:
    """A new UTF-8 text file to write at the location (replacing any there), its folder made if need be."""
    if not is_uri(location):
        return open(location, "w", encoding="utf-8")
    filesystem, path = open_output(location)
    if "/" in path:
        filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
    return io.TextIOWrapper(filesystem.open_output_stream(path), encoding="utf-8")
