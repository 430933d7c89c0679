"""Reading a dataset file: one streaming pass that yields a Request or a LineError per request line (inputs.py
validates each line), with what the pass found out (DatasetScan: counts, the batch's task, a whole-file problem).

`scan_dataset` holds one line in memory at a time; `parse_dataset` gathers its items in lists, for files that fit.
A custom id an earlier valid line used makes the line a duplicate; the ids are remembered by a FirstLines dict, or
for a big file by seen_ids.SeenIds (12 bytes an id), which the caller passes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from miro.core.errors import MiroError

from miro.worker.fleet.intake import tables
from miro.worker.fleet.intake.columns import InputColumns
from miro.worker.fleet.intake.inputs import (
    TASKS,
    LineError,
    LineProblem,
    Request,
    checked_defaults,
    checked_pooling_defaults,
    json_object,
    parse_line,
    parse_object,
    task_mismatch,
)
from miro.worker.fleet.intake.line_forms import short_text


@dataclass
class ParseResult:
    requests: list[Request] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)
    file_error: str | None = None  # a problem with the whole file (it is empty)
    task: str = "generate"  # what the batch does: "generate" or "embed" (the task asked for, or its first line's)

    @property
    def ok(self) -> bool:
        return not self.errors and self.file_error is None


def _read_lines(f: BinaryIO, max_line_bytes: int) -> Iterator[tuple[int, bytes | None, int]]:
    """(line number, content without line ending or None when over the limit, size in bytes)."""
    number = 0
    while raw := f.readline(max_line_bytes + 2):  # room for the content and "\r\n"
        number += 1
        if not raw.endswith(b"\n") and len(raw) == max_line_bytes + 2:  # too long: skip it in chunks
            size, tail = len(raw), raw[-2:]
            while chunk := f.readline(1 << 20):
                size, tail = size + len(chunk), (tail + chunk)[-2:]
                if chunk.endswith(b"\n"):
                    break
            yield number, None, size - (2 if tail == b"\r\n" else 1 if tail.endswith(b"\n") else 0)
            continue
        content = raw.rstrip(b"\r\n")
        yield number, (content if len(content) <= max_line_bytes else None), len(content)


@dataclass
class DatasetScan:
    """What scan_dataset has read so far; whole once its iterator is exhausted."""

    lines: int = 0  # request lines read: valid + invalid (blank lines are no requests)
    valid: int = 0
    invalid: int = 0
    task: str = "generate"  # the task asked for, or the first valid line's
    file_error: str | None = None  # a problem with the whole file (empty, or no line a request), set at the end
    bytes_read: int = 0
    bytes_total: int = 0


class FirstLines:
    """custom id -> the line that first used it, for small files (seen_ids.SeenIds: 12 bytes an id, for big ones)."""

    def __init__(self):
        self._lines: dict[str, int] = {}

    def first_line(self, custom_id: str, line: int) -> int | None:
        """The line that used `custom_id` before, or None (and `line` is remembered as its first)."""
        first = self._lines.setdefault(custom_id, line)
        return None if first == line else first

    def __contains__(self, custom_id: str) -> bool:
        return custom_id in self._lines


def parse_dataset(
    path: str | Path,
    defaults: dict | None = None,
    max_line_bytes: int = 1_000_000,
    endpoint: str | None = None,
    task: str | None = None,
    pooling_defaults: dict | None = None,
    columns: InputColumns | None = None,
    input_format: str | None = None,
) -> ParseResult:
    """Validate a dataset into memory: scan_dataset's items as lists (for files that fit in memory)."""
    scan, result = DatasetScan(), ParseResult()
    for item in scan_dataset(
        path,
        defaults,
        max_line_bytes,
        endpoint,
        task,
        pooling_defaults,
        scan=scan,
        columns=columns,
        input_format=input_format,
    ):
        (result.errors if isinstance(item, LineError) else result.requests).append(item)
    result.file_error, result.task = scan.file_error, scan.task
    return result


PROGRESS_EVERY = 4096  # lines between two on_progress calls


def scan_dataset(
    path: str | Path,
    defaults: dict | None = None,
    max_line_bytes: int = 1_000_000,
    endpoint: str | None = None,
    task: str | None = None,
    pooling_defaults: dict | None = None,
    *,
    scan: DatasetScan | None = None,
    seen=None,
    on_progress: Callable[[DatasetScan], None] | None = None,
    columns: InputColumns | None = None,
    input_format: str | None = None,
) -> Iterator[Request | LineError]:
    """Validate a JSONL dataset line by line: yields a Request or a LineError per request line, in file order,
    holding one line in memory at a time. Raises MiroError if the file cannot be read.

    With `endpoint` (an OpenAI batch's, e.g. "/v1/chat/completions") every line must be an OpenAI Batch line
    with that url, as OpenAI's Batch API requires. `task` ("generate" or "embed") is what the batch does; with
    "embed" a simple line's `prompt` is embedded. Without it the first valid line decides. `defaults` are
    SamplingParams keyword arguments for generation lines without them, `pooling_defaults` PoolingParams ones
    for embedding lines. `scan` is filled in as it goes; `seen` remembers custom ids (anything with
    `first_line(custom_id, line) -> earlier line or None`: seen_ids.SeenIds for big files, a dict by default);
    `on_progress(scan)` is called every PROGRESS_EVERY lines and at the end.

    `input_format` (tables.FORMATS; None: by the extension) reads a Parquet, CSV or saved HF dataset a batch of rows
    at a time instead, each row made a simple line's object by `columns` (columns.InputColumns; on a JSONL file
    they map each line's keys the same way) and validated as that line would be; its errors say "row N".
    """
    path = Path(path)
    defaults = checked_defaults(defaults)
    pooling_defaults = checked_pooling_defaults(pooling_defaults)
    if task is not None and task not in TASKS:
        raise MiroError(f"The task '{task}' is not one of {', '.join(TASKS)}.")
    fmt = tables.input_format(path, input_format)
    if endpoint is not None and (fmt != "jsonl" or (columns is not None and columns.given)):
        raise MiroError("An OpenAI batch's input file is JSON Lines of OpenAI Batch requests, not a table.")
    if fmt != "jsonl":
        yield from _scan_table(
            path,
            fmt,
            columns or InputColumns(),
            defaults,
            pooling_defaults,
            task,
            scan if scan is not None else DatasetScan(),
            seen if seen is not None else FirstLines(),
            on_progress,
        )
        return
    mapping = columns if columns is not None and columns.given else None
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise MiroError(f"Dataset file '{path}' does not exist.") from None
    except IsADirectoryError:
        raise MiroError(f"Dataset path '{path}' is a directory, not a JSONL file.") from None
    except OSError as e:
        raise MiroError(f"Dataset file '{path}' cannot be read ({e.strerror or e}).") from None

    scan = scan if scan is not None else DatasetScan()
    seen = seen if seen is not None else FirstLines()
    scan.task = task or scan.task
    checks = _Checks(scan, seen, task)
    saw_content = False
    first_content = b""

    def invalid(number: int, custom_id: str | None, message: str, code: str = "invalid_request") -> LineError:
        scan.invalid += 1
        return LineError(number, custom_id, message, code)

    with f:
        scan.bytes_total = os.fstat(f.fileno()).st_size
        for number, content, size in _read_lines(f, max_line_bytes):
            if on_progress is not None and number % PROGRESS_EVERY == 0:
                scan.bytes_read = f.tell()
                on_progress(scan)
            if content is None:
                saw_content = True
                scan.lines += 1
                yield invalid(
                    number,
                    None,
                    f"line {number}: the line is {size:,} bytes, over the limit of {max_line_bytes:,} bytes.",
                )
                continue
            if number == 1 and content.startswith(b"\xef\xbb\xbf"):
                content = content[3:]  # a UTF-8 byte order mark, as some editors write
            if not content.strip():
                continue
            saw_content = True
            scan.lines += 1
            first_content = first_content or content.strip()
            try:
                text = content.decode("utf-8")
            except UnicodeDecodeError as e:
                bad = f"byte 0x{content[e.start]:02x} at byte {e.start + 1} of the line"
                yield invalid(number, None, f"line {number}: not valid UTF-8 ({bad}).")
                continue
            try:
                if mapping is None:
                    request = parse_line(number, text, defaults, pooling_defaults, task)
                else:
                    request = parse_object(
                        number, mapping.line_object(json_object(text)), defaults, pooling_defaults, task
                    )
            except LineProblem as problem:
                message = str(problem) if mapping is None else mapping.described(str(problem))
                yield invalid(number, problem.custom_id, f"line {number}: {message}.")
                continue
            if endpoint is not None and request.url != endpoint:
                given = f"url '{request.url}'" if request.url else "no url (a simple line)"
                yield invalid(
                    number,
                    request.custom_id,
                    f"line {number}: {given}, but the batch's endpoint is '{endpoint}'.",
                    "url_mismatch",
                )
                continue
            yield checks.admitted(request, number)
        scan.bytes_read = scan.bytes_total
    if not saw_content:
        scan.file_error = f"Dataset file '{path}' is empty: it has no request lines."
    elif not scan.valid:
        scan.file_error = _wrong_format(path, first_content)
    if on_progress is not None:
        on_progress(scan)


class _Checks:
    """What is checked of a valid request against the others: the batch's one task, and a custom id used once."""

    def __init__(self, scan: DatasetScan, seen, task: str | None, unit: str = "line"):
        self.scan, self.seen, self.task, self.unit = scan, seen, task, unit
        self.task_line: int | None = None  # the line that set the batch's task, when no task was given

    def admitted(self, request: Request, number: int) -> Request | LineError:
        scan = self.scan
        if self.task is None and self.task_line is None:
            self.task_line = number
            scan.task = request.task
        if request.task != scan.task:
            scan.invalid += 1
            message = task_mismatch(number, request, self.task, self.task_line)
            if self.unit != "line":
                message = message.replace("line", self.unit)
            return LineError(number, request.custom_id, message, "task_mismatch")
        first = self.seen.first_line(request.custom_id, number)
        if first is not None:
            scan.invalid += 1
            shown = short_text(request.custom_id)
            return LineError(
                number,
                request.custom_id,
                f"{self.unit} {number}: duplicate custom id {shown!r} (first used on {self.unit} {first}).",
                "duplicate_custom_id",
            )
        scan.valid += 1
        return request


def _scan_table(
    path: Path,
    fmt: str,
    columns: InputColumns,
    defaults: dict,
    pooling_defaults: dict,
    task: str | None,
    scan: DatasetScan,
    seen,
    on_progress: Callable[[DatasetScan], None] | None,
) -> Iterator[Request | LineError]:
    """scan_dataset for a Parquet, CSV or Arrow dataset: each row a simple line's object (columns.py), validated
    as that line; its problems say "row N"."""
    columns.check(tables.table_columns(path, fmt))
    scan.task = task or scan.task
    checks = _Checks(scan, seen, task, unit="row")
    progress = tables.Progress()
    for number, row in tables.read_rows(path, fmt, progress):
        scan.lines += 1
        if on_progress is not None and number % PROGRESS_EVERY == 0:
            scan.bytes_read, scan.bytes_total = progress.read, progress.total
            on_progress(scan)
        if isinstance(row, int):  # its size: over the limit, as an over-long line
            scan.invalid += 1
            yield LineError(
                number,
                None,
                f"row {number}: the row holds {row:,} bytes, over the limit of {tables.MAX_ROW_BYTES:,} bytes.",
            )
            continue
        try:
            request = parse_object(number, columns.line_object(row), defaults, pooling_defaults, task)
        except LineProblem as problem:
            scan.invalid += 1
            yield LineError(number, problem.custom_id, f"row {number}: {columns.described(str(problem))}.")
            continue
        yield checks.admitted(request, number)
    scan.bytes_read = scan.bytes_total = progress.total
    if not scan.lines:
        scan.file_error = f"Dataset file '{path}' has no rows."
    if on_progress is not None:
        on_progress(scan)


def _wrong_format(path: Path, first_line: bytes) -> str | None:
    """When no line is a request, what the file looks like instead, so the user gets one sentence, not one per line."""
    wanted = 'miro reads JSON Lines, one request object per line, e.g. {"id": "q1", "prompt": "..."}'
    if first_line.startswith(b"["):
        return f"Dataset file '{path}' holds a JSON array: {wanted}."
    if not first_line.startswith(b"{") and b"," in first_line:
        first = short_text(first_line.decode("utf-8", "replace"), 60)
        return (
            f"Dataset file '{path}' looks like CSV (its first line is {first!r}): give it a .csv name or "
            f"--input-format csv, or write JSON Lines ({wanted.removeprefix('miro reads ')})."
        )
    return None
